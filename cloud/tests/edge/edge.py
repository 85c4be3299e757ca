"""An edge node shaped as KubeEdge's edgehub, on third-party libraries (cryptography,
websockets): it joins with a token exactly as edgehub's certmanager does, then holds the
websocket session.

  edge.py --cert-url https://127.0.0.1:10002 --hub-url wss://127.0.0.1:10000 \
          --node edge-node-1 --token TOKEN [--no-ack]

Join: GET /ca.crt (DER), its SHA-256 checked against the token's first part; a P-256 key and a
DER certificate request (CN=system:node:{node}, O=system:nodes) sent with GET /edge.crt and
headers `Authorization: Bearer {jwt}`, `NodeName`; the DER certificate comes back.

Renewal (--renew, with a certificate kept in --state): the same request, authenticated with the
kept certificate instead of a token, as edgehub renews before expiry.

Session: wss://.../{projectID}/{node}/events with headers node_id and project_id. Every frame
received is printed as one JSON line on stdout; a message with a resourceversion is answered
as metamanager does (`response`, parent_msg_id, content "OK") unless --no-ack. Each stdin line
is sent as one frame as it is (so a test can send reports, garbage, or oversized frames). A
keepalive is sent every --heartbeat seconds (KubeEdge: 15). Errors go to stderr and exit 1.
"""

import argparse
import asyncio
import hashlib
import json
import os
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid

import websockets
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

PROJECT = "e632aba927ea4ac2b575ec1603d56f10"


def fail(why):
    print(f"edge: {why}", file=sys.stderr, flush=True)
    sys.exit(1)


def join(cert_url, node, token):
    parts = token.split(".")
    if len(parts) != 4:
        fail(f"token {token!r} credentials are in the wrong format")
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ca = urllib.request.urlopen(cert_url + "/ca.crt", context=ctx).read()
    digest = hashlib.sha256(ca).hexdigest()
    if digest != parts[0]:
        fail(f"failed to validate CA certificate. tokenCAhash: {parts[0]}, CAhash: {digest}")
    ca_pem = x509.load_der_x509_certificate(ca).public_bytes(serialization.Encoding.PEM)
    cert, key = request_certificate(
        cert_url, node, ca_pem, {"Authorization": "Bearer " + ".".join(parts[1:])})
    return ca_pem, cert, key


def request_certificate(cert_url, node, ca_pem, headers, client=None):
    """A new key and a certificate for it, asked with `headers` (a token) or with the
    certificate `client` (a (cert file, key file) pair: a renewal, as edgehub renews)."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.COUNTRY_NAME, "CN"),
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                    x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}"),
                ]
            )
        )
        .sign(key, hashes.SHA256())
    )
    verified = ssl.create_default_context(cadata=ca_pem.decode())
    verified.check_hostname = False
    if client:
        verified.load_cert_chain(client[0], client[1])
    req = urllib.request.Request(
        cert_url + "/edge.crt",
        data=csr.public_bytes(serialization.Encoding.DER),
        method="GET",
        headers={**headers, "NodeName": node},
    )
    try:
        der = urllib.request.urlopen(req, context=verified).read()
    except urllib.error.HTTPError as e:
        fail(f"failed to call http, code: {e.code}, message: {e.read().decode(errors='replace')}")
    return x509.load_der_x509_certificate(der), key


def save(state, name, cert, key):
    with open(os.path.join(state, f"{name}.crt"), "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(os.path.join(state, f"{name}.key"), "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))


def message(group, op, resource, content, parent=""):
    return {
        "header": {"msg_id": str(uuid.uuid4()), "parent_msg_id": parent,
                   "timestamp": int(time.time() * 1000), "sync": False},
        "route": {"source": "edgehub", "group": group, "operation": op, "resource": resource},
        "content": content,
    }


async def session(args, ca_pem, cert, key):
    d = tempfile.mkdtemp()
    with open(f"{d}/ca.crt", "wb") as f:
        f.write(ca_pem)
    with open(f"{d}/edge.crt", "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(f"{d}/edge.key", "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    ctx = ssl.create_default_context(cafile=f"{d}/ca.crt")
    ctx.check_hostname = False
    ctx.load_cert_chain(f"{d}/edge.crt", f"{d}/edge.key")
    url = f"{args.hub_url}/{PROJECT}/{args.node}/events"
    async with websockets.connect(
        url, ssl=ctx, max_size=None, max_queue=(1 if args.no_read else 16),
        additional_headers={"node_id": args.node, "project_id": PROJECT},
    ) as ws:
        print(json.dumps({"connected": args.node}), flush=True)
        loop = asyncio.get_running_loop()

        async def heartbeat():
            while True:
                await asyncio.sleep(args.heartbeat)
                await ws.send(json.dumps(message("resource", "keepalive", "node", "ping")))

        async def upstream():
            reader = asyncio.StreamReader(limit=64 << 20)
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
            while line := await reader.readline():
                await ws.send(line.decode().rstrip("\n"))

        tasks = [asyncio.create_task(heartbeat()), asyncio.create_task(upstream())]
        if args.no_read:
            # A node that stops reading: keeps pinging, never takes a frame (websockets stops
            # reading the socket once a few frames wait).
            await asyncio.sleep(3600)
            return
        try:
            async for frame in ws:
                msg = json.loads(frame)
                print(json.dumps(msg), flush=True)
                if msg["header"].get("resourceversion") and not args.no_ack:
                    answer = message("resource", "response", msg["route"]["resource"], "OK",
                                     parent=msg["header"]["msg_id"])
                    await ws.send(json.dumps(answer))
            print(json.dumps({"closed": f"{ws.close_code} {ws.close_reason}"}), flush=True)
        except websockets.ConnectionClosed as e:
            print(json.dumps({"closed": str(e)}), flush=True)
        for t in tasks:
            t.cancel()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cert-url", required=True)
    p.add_argument("--hub-url", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--no-ack", action="store_true")
    p.add_argument("--no-read", action="store_true")
    p.add_argument("--heartbeat", type=float, default=15.0)
    p.add_argument("--state", help="keeps the certificate here, and joins only when none is kept")
    p.add_argument("--renew", action="store_true",
                   help="renews the kept certificate with itself first (the old one is kept as edge-before-renewal.*)")
    args = p.parse_args()
    kept = args.state and os.path.exists(os.path.join(args.state, "edge.crt"))
    if kept:
        with open(os.path.join(args.state, "ca.crt"), "rb") as f:
            ca_pem = f.read()
        with open(os.path.join(args.state, "edge.crt"), "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
        with open(os.path.join(args.state, "edge.key"), "rb") as f:
            key = serialization.load_pem_private_key(f.read(), password=None)
    else:
        ca_pem, cert, key = join(args.cert_url, args.node, args.token)
        if args.state:
            os.makedirs(args.state, exist_ok=True)
            with open(os.path.join(args.state, "ca.crt"), "wb") as f:
                f.write(ca_pem)
            save(args.state, "edge", cert, key)
    print(json.dumps({"joined": cert.subject.rfc4514_string(), "kept": bool(kept)}), flush=True)
    if args.renew:
        if not kept:
            fail("--renew needs a certificate kept in --state")
        crt, k = (os.path.join(args.state, f"edge.{x}") for x in ("crt", "key"))
        new_cert, new_key = request_certificate(args.cert_url, args.node, ca_pem, {}, (crt, k))
        save(args.state, "edge-before-renewal", cert, key)
        save(args.state, "edge", new_cert, new_key)
        cert, key = new_cert, new_key
        print(json.dumps({"renewed": format(cert.serial_number, "x")}), flush=True)
    try:
        asyncio.run(session(args, ca_pem, cert, key))
    except (OSError, websockets.exceptions.WebSocketException) as e:
        # No session: the cloud closed the connection before the websocket was open.
        print(json.dumps({"refused": f"{type(e).__name__}: {e}"}), flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
