#!/usr/bin/env python3
"""A stranger at a trainer's data port (the host data channel, protocol 2).

    stranger.py HOST:PORT PLAN_ID PLAN_HASH_HEX [SILENT]

Opens SILENT (default 6) connections that never send a byte, then, one after
the other: a hello of the first handshake (protocol 1) presenting PLAN_ID and
PLAN_HASH, and three hellos of protocol 2 answering the root's challenge with
that id and hash but a proof made without the plan's secret (which a stranger
does not have). Every connection is read until the root closes it (at most
30 s). Prints one JSON object: per connection, what it received and how long
the root kept it open; whether any reply leaked the plan id or hash; and
whether a challenge was ever anything but "RLBC", version 2 and 32 bytes.
"""
import json, os, socket, struct, sys, threading, time

CHALLENGE = 8 + 32
LIMIT_S = 30.0


def drain(sock, rec, t0):
    sock.settimeout(LIMIT_S)
    got = b""
    try:
        while True:
            b = sock.recv(65536)
            if not b:
                rec["closed_s"] = round(time.time() - t0, 3)
                break
            got += b
    except socket.timeout:
        rec["closed_s"] = None  # still open: the root kept it
    except OSError:  # a reset is a close too
        rec["closed_s"] = round(time.time() - t0, 3)
    rec["bytes"] = len(got)
    rec["challenge_ok"] = len(got) >= 8 and got[:4] == b"RLBC" and struct.unpack("<I", got[4:8])[0] == 2
    rec["data"] = got
    sock.close()


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    plan_id, plan_hash = sys.argv[2].encode(), int(sys.argv[3], 16)
    silent = int(sys.argv[4]) if len(sys.argv) > 4 else 6
    recs, threads = [], []
    for _ in range(silent):
        s = socket.create_connection((host, int(port)), timeout=10)
        rec = {"kind": "silent"}
        recs.append(rec)
        t = threading.Thread(target=drain, args=(s, rec, time.time()))
        t.start()
        threads.append(t)
    # Protocol 1: magic, version 1, rank, idlen, hash, id, sent at once.
    s = socket.create_connection((host, int(port)), timeout=10)
    rec = {"kind": "hello/1"}
    recs.append(rec)
    t0 = time.time()
    s.sendall(struct.pack("<IIIIQ", 0x48424C52, 1, 1, len(plan_id), plan_hash) + plan_id)
    drain(s, rec, t0)
    # Protocol 2: read the challenge, answer with a proof that is not one.
    for _ in range(3):
        s = socket.create_connection((host, int(port)), timeout=10)
        rec = {"kind": "hello/2"}
        recs.append(rec)
        t0 = time.time()
        s.settimeout(LIMIT_S)
        ch = b""
        try:
            while len(ch) < CHALLENGE:
                b = s.recv(CHALLENGE - len(ch))
                if not b:
                    break
                ch += b
        except OSError:
            pass
        if len(ch) == CHALLENGE:
            hello = struct.pack("<IIIIQ", 0x48424C52, 2, 1, len(plan_id), plan_hash)
            hello += os.urandom(32) + plan_id + os.urandom(32)
            try:
                s.sendall(hello)
            except OSError:
                pass
        drain(s, rec, t0)
        rec["data"] = ch + rec["data"]
        rec["bytes"] = len(rec["data"])
        rec["challenge_ok"] = ch[:4] == b"RLBC" and struct.unpack("<I", ch[4:8])[0] == 2
    for t in threads:
        t.join()
    needles = [plan_id, struct.pack("<Q", plan_hash), b"%016x" % plan_hash]
    leaked = any(n in r["data"] for r in recs for n in needles)
    for r in recs:
        del r["data"]
    closed = [r["closed_s"] for r in recs]
    print(json.dumps({
        "connections": recs,
        "leaked": leaked,
        "bad_challenge": any(not r["challenge_ok"] for r in recs),
        "max_bytes": max(r["bytes"] for r in recs),
        "all_closed": all(c is not None for c in closed),
        "max_open_s": max(c for c in closed if c is not None) if any(c is not None for c in closed) else None,
    }))


main()
