"""A Modbus TCP server on pymodbus (a simulator the project did not write) with known values.

Usage: python3 modbus_server.py PORT          (Modbus TCP on 127.0.0.1:PORT)
       python3 modbus_server.py rtu:DEVICE    (Modbus RTU on a serial device, e.g. a socat pty)

Holding registers (unit 1):
  0      650          (a uint16: 25.0 with scale 0.1 and offset -40)
  1..2   123.456      (float32, ABCD)
  3..4   123.456      (float32, CDAB)
  5      0xFFFE       (int16 -2)
  10..13 "PLC-7"      (string, 4 registers)
  21..29 do not exist: a request touching them gets IllegalDataAddress
  30..39 30..39       (writable scratch)
Coils: 0..7 alternate true/false.
Prints "ready" on stdout once listening.
"""

import asyncio
import warnings
import struct
import sys

from pymodbus.datastore import (
    ModbusDeviceContext,
    ModbusSequentialDataBlock,
    ModbusServerContext,
    ModbusSparseDataBlock,
)
from pymodbus import FramerType
from pymodbus.server import StartAsyncSerialServer, StartAsyncTcpServer


def words(fmt, value):
    raw = struct.pack(fmt, value)
    return [int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2)]


def holding():
    regs = {0: 650, 5: 0xFFFE}
    abcd = words(">f", 123.456)
    for i, w in enumerate(abcd):
        regs[1 + i] = w
    for i, w in enumerate(reversed(abcd)):
        regs[3 + i] = w
    text = b"PLC-7".ljust(8, b"\0")
    for i in range(4):
        regs[10 + i] = int.from_bytes(text[2 * i : 2 * i + 2], "big")
    for a in range(0, 21):
        regs.setdefault(a, 0)
    for a in range(30, 40):
        regs[a] = a
    return regs


async def main(port):
    # The datastore classes still work in 3.16 and say they go in v4; keep stderr for real errors.
    warnings.simplefilter("ignore")
    hr = ModbusSparseDataBlock(holding())
    # A sequential block counts from 1 (protocol address 0); a sparse one does not.
    co = ModbusSequentialDataBlock(1, [i % 2 == 0 for i in range(8)])
    device = ModbusDeviceContext(hr=hr, co=co, di=co, ir=hr)
    context = ModbusServerContext(devices=device, single=True)
    if str(port).startswith("rtu:"):
        server = StartAsyncSerialServer(
            context=context, port=port[4:], framer=FramerType.RTU, baudrate=19200
        )
    else:
        server = StartAsyncTcpServer(context=context, address=("127.0.0.1", int(port)))
    task = asyncio.ensure_future(server)
    await asyncio.sleep(0.5)
    print("ready", flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
