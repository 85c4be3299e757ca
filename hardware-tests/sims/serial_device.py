"""Device emulator for the serial mapper's tests, on one end of a pty pair (pyserial).

Usage: python3 serial_device.py ascii|binary DEVICE

ascii: several devices on one line, addressed by a "#N " prefix, lines ending in CR LF:
  "#1 MEAS?"      -> "#1 T=<temperature> H=<humidity> S=OK"   (temperature rises 0.1 per read)
  "#1 COUNT?"     -> "#1 C=<MEAS? requests so far> Q=<COUNT? requests so far>"
  "#1 SP?"        -> "#1 SP=<setpoint>"
  "#1 SP <int>"   -> "#1 OK" and the set point changes, or "#1 ERR" for a non-integer
  "#1 GARBLE?"    -> a line of garbage
  "#2 ..."        -> nothing: a silent device
  "#3 MEAS?"      -> "#3 T=1.0 ..." but only after 0.5 s: a device that answers late

binary: frames start with AA and end with a CRC-16/MODBUS (low byte first):
  AA 01 crc       -> AA 01 <temperature x10, int16 BE> <count, uint16 LE> <flags> crc
                     (count rises by one per read, flags bit 0 is set while count is odd)
  AA 02 crc       -> the same answer with a wrong checksum
  AA 03 crc       -> AA 03 <setpoint, uint16 BE> crc
  AA 10 <u16 BE> crc -> AA 10 00 crc, and the set point changes
  a request with a bad checksum gets no answer.

Prints "ready" once the port is open.
"""
import random
import struct
import sys
import threading
import time

import serial


def crc16_modbus(data: bytes) -> bytes:
    crc = 0xFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
    return struct.pack("<H", crc)


def ascii_device(port: serial.Serial) -> None:
    temperature = 20.0
    setpoint = 50
    meas = 0
    counts = 0
    lock = threading.Lock()

    def send(text: str) -> None:
        with lock:
            port.write((text + "\r\n").encode())

    buf = b""
    while True:
        buf += port.read(1) + port.read(port.in_waiting or 0)
        while b"\n" in buf:
            raw, buf = buf.split(b"\n", 1)
            line = raw.decode(errors="replace").strip()
            if not line.startswith("#"):
                continue
            addr, _, cmd = line.partition(" ")
            if addr == "#1":
                if cmd == "MEAS?":
                    meas += 1
                    temperature = round(temperature + 0.1, 1)
                    send(f"#1 T={temperature} H=41.5 S=OK")
                elif cmd == "COUNT?":
                    counts += 1
                    send(f"#1 C={meas} Q={counts}")
                elif cmd == "SP?":
                    send(f"#1 SP={setpoint}")
                elif cmd.startswith("SP "):
                    try:
                        setpoint = int(cmd[3:])
                        send("#1 OK")
                    except ValueError:
                        send("#1 ERR")
                elif cmd == "GARBLE?":
                    send("#1 " + "".join(random.choice("%$&!?") for _ in range(12)))
            elif addr == "#3" and cmd == "MEAS?":
                threading.Timer(0.5, send, ["#3 T=1.0 H=1.0 S=LATE"]).start()
            # "#2" and anything else: silence.


def binary_device(port: serial.Serial) -> None:
    temperature = -12.5
    count = 0
    setpoint = 100
    buf = b""
    while True:
        buf += port.read(1) + port.read(port.in_waiting or 0)
        while buf and buf[0] != 0xAA:
            buf = buf[1:]
        if len(buf) < 2:
            continue
        need = 6 if buf[1] == 0x10 else 4
        if len(buf) < need:
            continue
        frame, buf = buf[:need], buf[need:]
        if crc16_modbus(frame[:-2]) != frame[-2:]:
            continue
        cmd = frame[1]
        if cmd in (0x01, 0x02):
            count += 1
            body = bytes([0xAA, cmd]) + struct.pack(">h", round(temperature * 10))
            body += struct.pack("<H", count) + bytes([count & 1])
            crc = crc16_modbus(body)
            if cmd == 0x02:
                crc = bytes([crc[0] ^ 0xFF, crc[1]])
            port.write(body + crc)
        elif cmd == 0x03:
            body = bytes([0xAA, 0x03]) + struct.pack(">H", setpoint)
            port.write(body + crc16_modbus(body))
        elif cmd == 0x10:
            setpoint = struct.unpack(">H", frame[2:4])[0]
            body = bytes([0xAA, 0x10, 0x00])
            port.write(body + crc16_modbus(body))


def main() -> int:
    mode, device = sys.argv[1], sys.argv[2]
    port = serial.Serial(device, 9600, timeout=None)
    print("ready", flush=True)
    try:
        if mode == "ascii":
            ascii_device(port)
        else:
            binary_device(port)
    except (KeyboardInterrupt, serial.SerialException):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
