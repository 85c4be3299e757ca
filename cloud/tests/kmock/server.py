"""kmock's KubernetesEmulator (a third-party Kubernetes API emulator, PyPI `kmock`) on a
loopback port, for the kube-rs tests that must pass against it as well as against cloudcore.

kmock 0.8 lacks a few things a kube-rs client needs; they are patched in here, in the harness,
in the test harness only, never in the project:
- objects get a `metadata.resourceVersion` on create and update (kube-rs' watcher needs one),
  and `metadata.namespace` from the URL on create;
- PUT on a named object is an update (kmock only treats PATCH as one);
- lists carry `kind` and `apiVersion`.

Usage: python3 server.py  -> prints "PORT <n>" once it listens, serves until stdin closes.
"""

import asyncio
import itertools
import sys

import kmock
from kmock._internal import enums, k8s, parsing

_versions = itertools.count(1)
_guess = parsing.guess_k8s


def _guess_with_put(k8s_path, method, query):
    if k8s_path.group is not None and k8s_path.name is not None and method == enums.method.PUT:
        return enums.action.UPDATE
    return _guess(k8s_path, method, query)


parsing.guess_k8s = _guess_with_put
for module in list(sys.modules.values()):
    if getattr(module, "guess_k8s", None) is _guess:
        module.guess_k8s = _guess_with_put

_handle = k8s.KubernetesEmulator._handle


async def _handle_stamped(self, request):
    if request.resource is not None and isinstance(request.data, dict):
        if request.action in (enums.action.CREATE, enums.action.UPDATE):
            meta = request.data.setdefault("metadata", {})
            meta["resourceVersion"] = str(next(_versions))
            if request.action == enums.action.CREATE and request.namespace:
                meta.setdefault("namespace", request.namespace)
    return await _handle(self, request)


k8s.KubernetesEmulator._handle = _handle_stamped

_list = k8s.KubernetesEmulator._serve_list


async def _list_typed(self, request):
    out = await _list(self, request)
    res = request.resource
    info = self.resources[res]
    out["kind"] = (info.kind or res.plural.capitalize()) + "List"
    out["apiVersion"] = f"{res.group}/{res.version}" if res.group else res.version
    out["metadata"] = {"resourceVersion": str(next(_versions))}
    return out


k8s.KubernetesEmulator._serve_list = _list_typed


async def main():
    emulator = kmock.KubernetesEmulator()
    emulator.resources["devices.kubeedge.io/v1beta1/devices"] = {
        "kind": "Device",
        "singular": "device",
        "namespaced": True,
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
    }
    for plural, kind in [("devicemodels", "DeviceModel"), ("devicestatuses", "DeviceStatus")]:
        emulator.resources[f"devices.kubeedge.io/v1beta1/{plural}"] = {
            "kind": kind,
            "singular": kind.lower(),
            "namespaced": True,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        }
    emulator.resources["v1/configmaps"] = {
        "kind": "ConfigMap",
        "singular": "configmap",
        "namespaced": True,
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
    }
    emulator.resources["v1/nodes"] = {
        "kind": "Node",
        "singular": "node",
        "namespaced": False,
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
    }
    async with emulator, kmock.Server(emulator) as server:
        print(f"PORT {server.port}", flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.read)


asyncio.run(main())
