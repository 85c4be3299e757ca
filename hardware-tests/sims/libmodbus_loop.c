/* Throughput of libmodbus (Debian's libmodbus-dev): reads COUNT holding registers from address 0
 * of HOST:PORT in a loop for SECONDS and prints "TRANSACTIONS ELAPSED_SECONDS".
 *
 * Built and run by the modbus-bench binary:
 *   cc -O2 libmodbus_loop.c $(pkg-config --cflags --libs libmodbus) -o libmodbus_loop
 *   ./libmodbus_loop HOST PORT SECONDS COUNT
 */
#include <errno.h>
#include <modbus.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s HOST PORT SECONDS COUNT\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[2]);
    double seconds = atof(argv[3]);
    int count = atoi(argv[4]);
    if (count < 1 || count > 125) {
        fprintf(stderr, "COUNT must be 1..125\n");
        return 2;
    }
    modbus_t *ctx = modbus_new_tcp(argv[1], port);
    if (ctx == NULL || modbus_connect(ctx) != 0) {
        fprintf(stderr, "cannot connect to %s:%d: %s\n", argv[1], port, modbus_strerror(errno));
        return 1;
    }
    modbus_set_slave(ctx, 1);
    uint16_t regs[125];
    long done = 0;
    double start = now();
    double deadline = start + seconds;
    while (now() < deadline) {
        if (modbus_read_registers(ctx, 0, count, regs) != count) {
            fprintf(stderr, "read failed: %s\n", modbus_strerror(errno));
            return 1;
        }
        done++;
    }
    double elapsed = now() - start;
    modbus_close(ctx);
    modbus_free(ctx);
    printf("%ld %.6f\n", done, elapsed);
    return 0;
}
