#!/usr/bin/env python3
"""BLE peripherals behind a scripted BlueZ, for mapper-ble's tests.

BlueZ itself is python-dbusmock's `bluez5` template (a third-party emulation of BlueZ's D-Bus
API: org.bluez.Adapter1, Device1, ...), started by this script as a child on the bus named by
DBUS_SYSTEM_BUS_ADDRESS (the test's own dbus-daemon). This script adds an adapter, the devices of
SPEC (a JSON file) with their GATT services and characteristics, and then takes commands on
stdin, one per line, answering each with one line ("ok ..." or "error ..."):

  set ADDRESS CHAR_UUID HEX   the characteristic's value changes (a notification when notifying)
  get ADDRESS CHAR_UUID       the value, as hex
  reads ADDRESS CHAR_UUID     how many ReadValue calls the characteristic has answered
  writes ADDRESS CHAR_UUID    how many WriteValue calls it has taken
  vanish ADDRESS              the device drops its connection and goes out of range
  appear ADDRESS              the device is back in range (discoverable, not connected)
  connected ADDRESS           1 when connected, else 0

SPEC: {"adapter": "hci0", "devices": [{"address": "C4:7C:8D:6A:12:34", "name": "env-1",
  "services": [{"uuid": "...", "characteristics": [{"uuid": "...",
  "flags": ["read", "write", "notify"], "value": "hex", "error": "NotPermitted"}]}]}]}

Two quirks of dbusmock 0.28 are handled here: every GATT object gets methods (an object with
properties only is introspected so that btleplug's XML parser fails), and Device1.Connect and
Disconnect are replaced so that they update the Connected and ServicesResolved properties.
"""

import json
import os
import subprocess
import sys
import time

import dbus

BUS_NAME = "org.bluez"
MOCK = "org.freedesktop.DBus.Mock"
BLUEZ_MOCK = "org.bluez.Mock"
DEVICE = "org.bluez.Device1"
SERVICE = "org.bluez.GattService1"
CHAR = "org.bluez.GattCharacteristic1"

# Method bodies run by dbusmock inside the mock object (`self`, `args`, `ret`).
CONNECT = (
    "if self.Get('org.bluez.Device1', 'Connected'):\n"
    "    raise dbus.exceptions.DBusException('Already Connected', name='org.bluez.Error.AlreadyConnected')\n"
    "self.UpdateProperties('org.bluez.Device1', {'Connected': dbus.Boolean(True), 'ServicesResolved': dbus.Boolean(True)})\n"
)
DISCONNECT = (
    "self.UpdateProperties('org.bluez.Device1', {'Connected': dbus.Boolean(False), 'ServicesResolved': dbus.Boolean(False)})\n"
)
READ = (
    "self.reads = getattr(self, 'reads', 0) + 1\n"
    "ret = self.Get('org.bluez.GattCharacteristic1', 'Value')\n"
)
# The test's own interface on each characteristic: how many reads it answered.
SIM = "org.kubeedge.Sim1"
READS = "ret = dbus.UInt32(getattr(self, 'reads', 0))\n"
WRITES = "ret = dbus.UInt32(getattr(self, 'writes', 0))\n"
READ_FAILS = (
    "raise dbus.exceptions.DBusException('Read not permitted', name='org.bluez.Error.{error}')\n"
)
WRITE = (
    "self.writes = getattr(self, 'writes', 0) + 1\n"
    "self.UpdateProperties('org.bluez.GattCharacteristic1', "
    "{'Value': dbus.Array(args[0], signature='y')})\n"
)
START_NOTIFY = "self.UpdateProperties('org.bluez.GattCharacteristic1', {'Notifying': dbus.Boolean(True)})\n"
STOP_NOTIFY = "self.UpdateProperties('org.bluez.GattCharacteristic1', {'Notifying': dbus.Boolean(False)})\n"


def device_path(adapter, address):
    return f"/org/bluez/{adapter}/dev_" + address.upper().replace(":", "_")


class Peripherals:
    def __init__(self, spec):
        self.adapter = spec.get("adapter", "hci0")
        self.devices = {d["address"].upper(): d for d in spec["devices"]}
        self.bus = dbus.SystemBus()
        self.root = dbus.Interface(self.bus.get_object(BUS_NAME, "/"), BLUEZ_MOCK)
        self.root.AddAdapter(self.adapter, "gateway")
        self.present = set()
        for address in self.devices:
            self.add(address)

    def obj(self, path, iface=MOCK):
        return dbus.Interface(self.bus.get_object(BUS_NAME, path), iface)

    def char_path(self, address, char_uuid):
        for s, service in enumerate(self.devices[address]["services"]):
            for c, ch in enumerate(service["characteristics"]):
                if ch["uuid"].lower() == char_uuid.lower():
                    return f"{device_path(self.adapter, address)}/service{s + 1:04x}/char{c + 1:04x}"
        raise KeyError(f"{address} has no characteristic {char_uuid}")

    def add(self, address):
        spec = self.devices[address]
        path = self.root.AddDevice(self.adapter, address, spec.get("name", ""))
        device = self.obj(path)
        device.AddMethod(DEVICE, "Connect", "", "", CONNECT)
        device.AddMethod(DEVICE, "Disconnect", "", "", DISCONNECT)
        uuids = []
        for s, service in enumerate(spec["services"]):
            spath = f"{path}/service{s + 1:04x}"
            uuids.append(service["uuid"])
            self.add_object(spath, SERVICE, {
                "UUID": service["uuid"],
                "Primary": dbus.Boolean(True),
                "Device": dbus.ObjectPath(path),
                "Includes": dbus.Array([], signature="o"),
            }, [("Nothing", "", "", "")])
            for c, ch in enumerate(service["characteristics"]):
                cpath = f"{spath}/char{c + 1:04x}"
                read = READ_FAILS.format(error=ch["error"]) if ch.get("error") else READ
                self.add_object(cpath, CHAR, {
                    "UUID": ch["uuid"],
                    "Service": dbus.ObjectPath(spath),
                    "Flags": dbus.Array(ch.get("flags", ["read"]), signature="s"),
                    "Value": dbus.Array(bytes.fromhex(ch.get("value", "")), signature="y"),
                    "Notifying": dbus.Boolean(False),
                }, [
                    ("ReadValue", "a{sv}", "ay", read),
                    ("WriteValue", "aya{sv}", "", WRITE),
                    ("StartNotify", "", "", START_NOTIFY),
                    ("StopNotify", "", "", STOP_NOTIFY),
                ])
                self.obj(cpath).AddMethod(SIM, "Reads", "", "u", READS)
                self.obj(cpath).AddMethod(SIM, "Writes", "", "u", WRITES)
        device.UpdateProperties(DEVICE, {"UUIDs": dbus.Array(uuids, signature="s")})
        self.present.add(address)

    def add_object(self, path, iface, props, methods):
        root = dbus.Interface(self.bus.get_object(BUS_NAME, "/"), MOCK)
        root.AddObject(path, iface, props, methods)
        # What bluetoothd announces for a new object; btleplug learns of GATT objects this way.
        root.EmitSignal(
            "org.freedesktop.DBus.ObjectManager", "InterfacesAdded", "oa{sa{sv}}",
            [dbus.ObjectPath(path),
             dbus.Dictionary({iface: dbus.Dictionary(props, signature="sv")}, signature="sa{sv}")],
        )

    def vanish(self, address):
        path = device_path(self.adapter, address)
        device = self.obj(path)
        device.UpdateProperties(DEVICE, {"Connected": False, "ServicesResolved": False})
        root = dbus.Interface(self.bus.get_object(BUS_NAME, "/"), MOCK)
        for s, service in enumerate(self.devices[address]["services"]):
            spath = f"{path}/service{s + 1:04x}"
            for c in range(len(service["characteristics"])):
                root.RemoveObject(f"{spath}/char{c + 1:04x}")
            root.RemoveObject(spath)
        self.obj(f"/org/bluez/{self.adapter}", "org.bluez.Adapter1").RemoveDevice(
            dbus.ObjectPath(path))
        self.present.discard(address)

    def command(self, words):
        op, address = words[0], words[1].upper() if len(words) > 1 else ""
        if address not in self.devices:
            return f"error no device {address!r}"
        if op == "appear":
            if address not in self.present:
                self.add(address)
            return "ok"
        if address not in self.present:
            return f"error {address} is out of range"
        if op == "vanish":
            self.vanish(address)
            return "ok"
        if op == "connected":
            props = self.obj(device_path(self.adapter, address), dbus.PROPERTIES_IFACE)
            return "ok " + ("1" if props.Get(DEVICE, "Connected") else "0")
        path = self.char_path(address, words[2])
        if op == "set":
            value = dbus.Array(bytes.fromhex(words[3]), signature="y")
            self.obj(path).UpdateProperties(CHAR, {"Value": value})
            return "ok"
        if op == "get":
            props = self.obj(path, dbus.PROPERTIES_IFACE)
            return "ok " + bytes(props.Get(CHAR, "Value")).hex()
        if op == "reads":
            return "ok " + str(int(self.obj(path, SIM).Reads()))
        if op == "writes":
            return "ok " + str(int(self.obj(path, SIM).Writes()))
        return f"error unknown command {op!r}"


def wait_for_bluez(bus, deadline):
    while time.monotonic() < deadline:
        if bus.name_has_owner(BUS_NAME):
            return True
        time.sleep(0.05)
    return False


def main():
    if len(sys.argv) != 2 or "DBUS_SYSTEM_BUS_ADDRESS" not in os.environ:
        sys.exit("usage: DBUS_SYSTEM_BUS_ADDRESS=... ble_peripherals.py SPEC.json")
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    mock = subprocess.Popen(
        [sys.executable, "-m", "dbusmock", "--system", "--template", "bluez5"],
        stdout=subprocess.DEVNULL,
    )
    try:
        bus = dbus.SystemBus()
        if not wait_for_bluez(bus, time.monotonic() + 20):
            sys.exit("dbusmock's bluez5 did not take org.bluez on the bus")
        peripherals = Peripherals(spec)
        print("ready", flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            try:
                answer = peripherals.command(words)
            except (dbus.exceptions.DBusException, KeyError, ValueError, IndexError) as e:
                answer = f"error {e}"
            print(answer, flush=True)
    finally:
        mock.terminate()
        mock.wait()


if __name__ == "__main__":
    main()
