"""pymodbus (a simulator the project did not write) serving units whose layout is drawn at random.

Usage:
  python3 modbus_random.py tcp:PORT  --units 1,2 --seed N --layout FILE --requests FILE
  python3 modbus_random.py line:LINK --units 5,17,42 --baud 38400 --parity E --stop 1 ...

Each unit gets a few values drawn from `--seed` at random addresses, with holes between some of
them (always around a float, whose words beside others can have a second reading) (addresses that do not exist: a read touching them is refused with IllegalDataAddress):
unsigned 16-bit counts, small negative 16-bit values, float32s in ABCD or CDAB word order,
NUL-padded text, coils and discrete inputs; input registers too. The layout is written as JSON
to `--layout` (what a test checks discovery against).

Every request pymodbus receives is logged to `--requests` as one line `unit function address`
(so a test can assert that nothing was written).

`line:LINK` is Modbus RTU on a pty made here, its other end linked at LINK for the client. The
slaves only hear a client whose port is set to the line's `--baud`, `--parity` and `--stop`
(read from the pty's settings for each chunk received): at any other settings a real slave
sees garbage and stays silent, and so do these. (A pty itself ignores baud rates. Linux also
clears the parity-enable flag of a pty, so even parity and none cannot be told apart here; odd
parity can, by its flag, and so can the baud rate and the stop bits.)

Prints "ready" once serving.
"""

import argparse
import asyncio
import fcntl
import json
import os
import random
import struct
import termios
import tty
import warnings

from pymodbus import FramerType
from pymodbus.datastore import (
    ModbusDeviceContext,
    ModbusServerContext,
    ModbusSparseDataBlock,
)
from pymodbus.server import StartAsyncSerialServer, StartAsyncTcpServer


def words(fmt, value):
    raw = struct.pack(fmt, value)
    return [int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2)]


def printable(b):
    return 0x20 <= b < 0x7F


def reads_as_text(ws):
    """Whether words start like text (two printable characters, a third): such a float would be
    ambiguous, and is not drawn."""
    return len(ws) > 1 and all(printable(b) for b in (ws[0] >> 8, ws[0] & 0xFF, ws[1] >> 8))


def reads_as_float(ws):
    """Whether two neighbouring words of a text (its register of NULs included) read as a
    round float32 discovery would take (either word order): such text would be ambiguous, and
    is not drawn."""
    return any(
        round_float(a, b) or round_float(b, a) for a, b in zip(ws, ws[1:])
    )


def round_float(hi, lo):
    """Whether two words read as a float32 discovery would take as someone's value: normal,
    1e-3 to 1e7, and written with 6 significant digits or fewer (its shortest form)."""
    f = struct.unpack(">f", struct.pack(">HH", hi, lo))[0]
    if f != f or not 1e-3 <= abs(f) <= 1e7:
        return False
    for digits in range(1, 7):
        if struct.unpack(">f", struct.pack(">f", float(f"{f:.{digits}g}")))[0] == f:
            return True
    return False


def joins_as_float(regs, address, ws):
    """Whether the word just before `address` and the first of `ws` read together as a round
    float32 (either word order): a value drawn right after another must make no such second
    reading with it (a text's first characters after a count read as one)."""
    prev = regs.get(address - 1)
    return prev is not None and (round_float(prev, ws[0]) or round_float(ws[0], prev))


def draw_registers(rng, table):
    """Items of one register table: (address -> word) and their descriptions."""
    regs, items = {}, []
    address = rng.randrange(0, 20)
    for _ in range(rng.randrange(3, 8)):
        kind = rng.choice(["uint16", "int16", "float32", "float32cdab", "string"])
        float_ = kind.startswith("float32")
        if float_ and address - 1 in regs:
            # A float has holes on both sides: its words beside other words can make a second
            # reading as good (a float ending in the next value's word), which no scan can
            # tell from the first.
            address += rng.randrange(1, 6)
        if kind == "uint16":
            while True:
                # Below 0x2000: a high byte that is not a printable character.
                value = rng.randrange(0, 8000)
                ws, shown = [value], value
                if not joins_as_float(regs, address, ws):
                    break
        elif kind == "int16":
            while True:
                value = -rng.randrange(1, 1000)
                ws, shown = [value & 0xFFFF], value
                if not joins_as_float(regs, address, ws):
                    break
        elif kind.startswith("float32"):
            while True:
                value = round(rng.uniform(1.0, 2000.0), 2)
                ws = words(">f", value)
                if kind == "float32cdab":
                    ws = list(reversed(ws))
                # Not ambiguous: its words in the other order must not also read as a round
                # float (discovery would have two equally good readings).
                other = (ws[0], ws[1]) if kind == "float32cdab" else (ws[1], ws[0])
                if not reads_as_text(ws) and not round_float(*other):
                    break
            shown = value
        else:
            letters = "ABCDEFGHJKLMNPRSTUVWXYZ0123456789-"
            while True:
                value = "".join(rng.choice(letters) for _ in range(rng.randrange(3, 9)))
                if rng.random() < 0.3:
                    # Padded with spaces, as many devices keep a name (the mapper trims them).
                    value += " " * rng.randrange(1, 3)
                raw = value.encode()
                raw = raw + b"\0" * (2 - len(raw) % 2 if len(raw) % 2 else 2)
                ws = [int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2)]
                if not reads_as_float(ws) and not joins_as_float(regs, address, ws):
                    break
            shown = value
        for i, w in enumerate(ws):
            regs[address + i] = w
        items.append(
            {"table": table, "address": address, "kind": kind, "count": len(ws), "value": shown}
        )
        address += len(ws)
        if float_ or rng.random() < 0.5:
            # A hole: addresses that do not exist.
            address += rng.randrange(1, 12)
    return regs, items


def draw_bits(rng, table):
    """One run of bits, in whole words of 16 from a multiple of 16: pymodbus keeps bits in
    16-bit words from the lowest to the highest it holds, so every bit in between answers."""
    bits, items = {}, []
    start = 16 * rng.randrange(3)
    for address in range(start, start + 16 * rng.randrange(1, 3)):
        value = rng.random() < 0.5
        bits[address] = value
        items.append({"table": table, "address": address, "kind": "bool", "count": 1, "value": value})
    return bits, items


def draw_unit(rng):
    hr, hr_items = draw_registers(rng, "HoldingRegister")
    ir, ir_items = draw_registers(rng, "InputRegister") if rng.random() < 0.7 else ({}, [])
    co, co_items = draw_bits(rng, "CoilRegister")
    di, di_items = draw_bits(rng, "DiscreteInputRegister") if rng.random() < 0.7 else ({}, [])
    blocks = {}
    for name, values in (("hr", hr), ("ir", ir), ("co", co), ("di", di)):
        # An empty table still needs a block: one address far off (scans stop well before).
        blocks[name] = ModbusSparseDataBlock(values or {60000: 0})
    context = ModbusDeviceContext(**blocks)
    return context, hr_items + ir_items + co_items + di_items


class RequestLog:
    def __init__(self, path):
        self.file = open(path, "a", buffering=1)

    def pdu(self, sending, pdu):
        if not sending:
            address = getattr(pdu, "address", "-")
            self.file.write(f"{pdu.dev_id} {pdu.function_code} {address}\n")
        return pdu


TCGETS2 = 0x802C542A  # _IOR('T', 0x2A, struct termios2) on x86_64


def line_settings(fd):
    """(baud, "O" for odd parity else "-", stop bits) the other end of the pty is set to.

    Read with TCGETS2: a client may set any baud rate (BOTHER, as the serialport crate does),
    which the old termios call cannot show; the kernel fills the speed in either way."""
    raw = fcntl.ioctl(fd, TCGETS2, bytes(44))
    cflag = struct.unpack_from("I", raw, 8)[0]
    ospeed = struct.unpack_from("I", raw, 40)[0]
    parity = "O" if cflag & termios.PARODD else "-"
    stop = 2 if cflag & termios.CSTOPB else 1
    return ospeed, parity, stop


async def gate(link, want, units):
    """A pty for the client at `link`, and one for pymodbus; bytes cross only at `want` settings,
    and only frames addressed to one of `units` (pymodbus answers any other unit id with an
    exception, as a gateway would; a slave on a line ignores frames not addressed to it).
    Returns the path pymodbus opens."""
    client_master, client_slave = os.openpty()
    tty.setraw(client_slave)
    server_master, server_slave = os.openpty()
    tty.setraw(server_slave)
    # Both slave ends stay open here, so a client closing and opening the port again never
    # leaves the master reading EOF.
    try:
        os.unlink(link)
    except FileNotFoundError:
        pass
    os.symlink(os.ttyname(client_slave), link)
    loop = asyncio.get_running_loop()
    heard = {"wrong": 0}

    def from_client():
        try:
            data = os.read(client_master, 4096)
        except OSError:
            return
        if line_settings(client_master) != want:
            heard["wrong"] += 1
        elif data and data[0] in units:
            os.write(server_master, data)

    def from_server():
        try:
            data = os.read(server_master, 4096)
        except OSError:
            return
        os.write(client_master, data)

    loop.add_reader(client_master, from_client)
    loop.add_reader(server_master, from_server)
    return os.ttyname(server_slave)


async def main():
    warnings.simplefilter("ignore")
    p = argparse.ArgumentParser()
    p.add_argument("where")
    p.add_argument("--units", default="1")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--layout", required=True)
    p.add_argument("--requests", required=True)
    p.add_argument("--baud", type=int, default=9600)
    p.add_argument("--parity", default="N")
    p.add_argument("--stop", type=int, default=1)
    a = p.parse_args()
    rng = random.Random(a.seed)
    devices, layout = {}, {}
    for unit in [int(u) for u in a.units.split(",")]:
        devices[unit], layout[unit] = draw_unit(rng)
    with open(a.layout, "w") as f:
        json.dump({str(u): items for u, items in layout.items()}, f, indent=1)
    context = ModbusServerContext(devices=devices, single=False)
    log = RequestLog(a.requests)
    kind, _, rest = a.where.partition(":")
    if kind == "tcp":
        server = StartAsyncTcpServer(
            context=context, address=("127.0.0.1", int(rest)), trace_pdu=log.pdu
        )
    elif kind == "line":
        port = await gate(
            rest, (a.baud, "O" if a.parity.upper() == "O" else "-", a.stop), set(devices)
        )
        server = StartAsyncSerialServer(
            context=context,
            port=port,
            framer=FramerType.RTU,
            baudrate=a.baud,
            trace_pdu=log.pdu,
        )
    else:
        raise SystemExit(f"{a.where}: tcp:PORT or line:PATH")
    task = asyncio.ensure_future(server)
    await asyncio.sleep(0.5)
    print("ready", flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(main())
