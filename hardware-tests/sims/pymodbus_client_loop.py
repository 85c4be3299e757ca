"""Throughput of pymodbus's synchronous TCP client: reads COUNT holding registers from address 0
of HOST:PORT in a loop for SECONDS and prints the number of transactions completed.

Usage: python3 pymodbus_client_loop.py HOST PORT SECONDS COUNT
Used by the modbus-bench binary as a peer to compare the mapper's client with.
"""
import sys
import time

from pymodbus.client import ModbusTcpClient


def main() -> int:
    host, port, seconds, count = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    client = ModbusTcpClient(host, port=port, timeout=2)
    if not client.connect():
        print(f"cannot connect to {host}:{port}", file=sys.stderr)
        return 1
    done = 0
    start = time.monotonic()
    deadline = start + seconds
    while time.monotonic() < deadline:
        r = client.read_holding_registers(0, count=count, device_id=1)
        if r.isError() or len(r.registers) != count:
            print(f"bad answer: {r}", file=sys.stderr)
            return 1
        done += 1
    elapsed = time.monotonic() - start
    client.close()
    print(f"{done} {elapsed:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
