#!/usr/bin/env python3
"""Writes the hand-made starting inputs of every fuzz target into fuzz/corpus/<target>/ (each
named by its content's hash, as libFuzzer names its own). scripts/fuzz runs it before a target
whose corpus directory is still empty; the fuzzer and `cargo fuzz cmin` take it from there."""
import hashlib, json, os, struct, sys, zlib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus")
ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
T0 = 1_700_000_000_000  # creation time of the req_ids (before the targets' clock)


def ulid(ms, rand):
    value = (ms << 80) | rand
    return "".join(ALPHABET[(value >> (5 * (25 - i))) & 31] for i in range(26))


def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


def amounts():
    for a in ["100.50", "100", "0.00000001", "1.000", "99999999999.99999999", "0", "0.000",
              "-1", "+1", "1e5", ".5", "5.", "01", "1,5", "NaN", "1.2.3", "100000000000",
              "0.0000000000000000001", "79228162514.264400000000000001",
              "12345678901.123456789012345678", "18446744073709551616", " 1", ""]:
        put("amount", a)


def bodies():
    base = {"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "100.50"}
    variants = [base, dict(base, cid="c-1", user_id=7), dict(base, user_id="7"),
                dict(base, user_id=8), dict(base, amount=5), dict(base, memo="x"),
                dict(base, to="FUNDING"), dict(base, to="FUTURE"), dict(base, asset="DOGE"),
                dict(base, amount="0.000000001"), dict(base, amount="1000000000"),
                dict(base, cid=None), {"from": "SPOT", "to": "FUNDING", "asset": "BTC", "amount": "1"}]
    for v in variants:
        put("transfer_body", json.dumps(v))
    put("transfer_body", "[1,2]")
    put("transfer_body", "{\"from\":")


def jwts():
    def head(mode, offset=60, at=0, xor=1):
        return bytes([mode]) + struct.pack("<iHB", offset, at, xor)
    hs = b'{"alg":"HS256","typ":"JWT"}'
    for claims, off in [(b'{"sub":"7","exp":EXP}', 60), (b'{"sub":"7","exp":EXP,"role":"admin"}', 600),
                        (b'{"sub":"7","exp":EXP,"nbf":NOW}', 60), (b'{"sub":"7","exp":EXP}', -3600),
                        (b'{"sub":"007","exp":EXP}', 60), (b'{"sub":7,"exp":EXP}', 60),
                        (b'{"sub":"7","exp":EXP}', 40 * 86400), (b'{"sub":"7"}', 60)]:
        put("jwt", head(1, off, 17, 0x20) + hs + b"\0" + claims)
    for h in [b'{"alg":"none"}', b'{"alg":"HS512"}', b'{"alg":"HS256","crit":["x"]}']:
        put("jwt", head(1, 60, 3, 1) + h + b"\0" + b'{"sub":"7","exp":EXP}')
    put("jwt", head(0) + b"a.b.c")
    put("jwt", head(0) + b"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI3In0.x")
    put("jwt", head(2, 3600) + struct.pack("<Q", 7) + b"\1")


def graphql():
    docs = [
        "{ balances { asset funding spot inFlight } stateCounts { state } }",
        """query($f: TransferFilter) { transfers(first: 100, filter: $f) { edges { cursor node {
           reqId state events { sequence eventType } } } nodes { ...T } pageInfo { hasNextPage } } }
           fragment T on Transfer { reqId state amount }""",
        "{ ...F3 } fragment F0 on QueryRoot { __typename } fragment F1 on QueryRoot { ...F0 ...F0 }"
        " fragment F2 on QueryRoot { ...F1 ...F1 } fragment F3 on QueryRoot { ...F2 ...F2 }",
        "{ ...A } fragment A on QueryRoot { ...B } fragment B on QueryRoot { ...A }",
        "{ a { b { c { d { e { f { g { h { i { j { k { l { m { n { o { p { q } } } } } } } } } } } } } } } } }",
        "{ ... on QueryRoot { balances { asset } } a: balances { asset } }",
        "{ ...U ...U } fragment G on QueryRoot { ...U }",
        "subscription { events { position } }",
        "mutation { x }",
    ]
    for d in docs:
        put("graphql", d)


def protocol():
    a, b = ulid(T0, 1), ulid(T0, 2)
    lines = [
        {"op": "deposit", "req_id": a, "user_id": 7, "asset": "USDT", "amount": "10.5"},
        {"op": "withdraw", "req_id": b, "user_id": 7, "asset": "USDT", "amount": "2"},
        {"op": "refund", "req_id": b, "user_id": 7, "asset": "USDT", "amount": "2"},
        {"op": "lookup", "req_id": b},
        {"op": "balances", "user_id": 7},
        {"op": "set_status", "user_id": 7, "asset": "USDT", "status": "FROZEN"},
        {"op": "cancel", "req_id": ulid(T0, 3), "movement": "withdraw", "user_id": 7,
         "asset": "USDT", "amount": "1"},
        {"op": "advance_horizon", "before_ms": T0 - 1},
        {"op": "retain", "after_seq": 1},
        {"op": "totals"}, {"op": "status"}, {"op": "ping"}, {"op": "journal", "after_seq": 0},
        {"op": "hello", "token": "t"},
    ]
    put("protocol_line", "\n".join(json.dumps(l) for l in lines))
    for l in lines:
        put("protocol_line", json.dumps(l))
    put("protocol_line", '{"op":"deposit","req_id":"x","user_id":0,"asset":"BTC","amount":"1e3"}')


def records():
    a, b = ulid(T0, 1), ulid(T0, 2)
    return [
        {"op": "deposit", "seq": 1, "req_id": a, "user_id": 7, "asset": "USDT", "amount": "10.5",
         "outcome": "applied", "code": None, "balance": "10.5"},
        {"op": "withdraw", "seq": 2, "req_id": b, "user_id": 7, "asset": "USDT", "amount": "2",
         "outcome": "applied", "code": None, "balance": "8.5"},
        {"op": "refund", "seq": 3, "req_id": b, "user_id": 7, "asset": "USDT", "amount": "2",
         "outcome": "applied", "code": None, "balance": "10.5"},
        {"op": "withdraw", "seq": 4, "req_id": ulid(T0, 3), "user_id": 8, "asset": "BTC",
         "amount": "1", "outcome": "refused", "code": "SOURCE_ACCOUNT_NOT_FOUND", "balance": None},
        {"op": "set_status", "seq": 5, "user_id": 7, "asset": "USDT", "status": "FROZEN"},
        {"op": "horizon", "seq": 6, "before_ms": T0 - 1},
        {"op": "retain", "seq": 7, "after_seq": 3},
    ]


def frame(payload):
    return struct.pack("<II", len(payload), zlib.crc32(payload)) + payload


def wal():
    recs = [json.dumps(r, separators=(",", ":")).encode() for r in records()]
    put("wal_segment", b"\1" + struct.pack("<H", 0xFFFF) + b"\n".join(recs))
    put("wal_segment", b"\1" + struct.pack("<H", 100) + b"\n".join(recs[:3]))
    raw = b"".join(frame(r) for r in recs)
    put("wal_segment", b"\0" + struct.pack("<H", len(raw) - 5) + raw)
    put("wal_segment", b"\0" + struct.pack("<H", 9) + raw[:40] + b"\0" * 8 + raw[40:])
    put("wal_segment", b"\0" + struct.pack("<H", 3) + raw + b"\0" * 16)
    damaged = bytearray(raw)
    damaged[12] ^= 0x10
    put("wal_segment", b"\0\0\0" + bytes(damaged))


def dec(mantissa, scale=0, negative=False):
    flags = (scale << 16) | (0x80000000 if negative else 0)
    return struct.pack("<IIII", flags, mantissa & 0xFFFFFFFF, (mantissa >> 32) & 0xFFFFFFFF,
                       (mantissa >> 64) & 0xFFFFFFFF)


def snapshot_body(accounts, remembered=(), assets=("USDT", "BTC")):
    body = struct.pack("<QQQQQ", 5, 0, 0, 1, 512)
    body += struct.pack("<I", len(assets))
    for a in assets:
        body += struct.pack("<H", len(a)) + a.encode()
    body += struct.pack("<Q", len(accounts))
    sums = {}
    for user, asset, status, mant, scale in accounts:
        body += struct.pack("<QHB", user, asset, status) + dec(mant, scale)
        sums[asset] = sums.get(asset, 0) + mant * 10 ** (8 - scale)
    body += struct.pack("<I", len(sums))
    for asset, s in sorted(sums.items()):
        body += struct.pack("<H", asset) + dec(s, 8)
    body += struct.pack("<Q", len(remembered))
    for rid, op, user, asset, outcome, seq, mant in remembered:
        body += rid.to_bytes(16, "little") + struct.pack("<BQHBQ", op, user, asset, outcome, seq)
        body += dec(mant, 1) + (b"\1" + dec(mant, 1) if outcome == 0 else b"\0" + dec(0))
    return body


def snapshots():
    rid = (T0 << 80) | 1
    b1 = snapshot_body([(7, 0, 0, 1050000000, 8), (8, 1, 1, 5, 0)],
                       [(rid, 1, 7, 0, 0, 1, 105), (rid, 2, 7, 0, 12, 2, 3)])
    put("snapshot", b"\1" + b1)
    put("snapshot", b"\1" + snapshot_body([]))
    hdr = b"SPOTSNAP" + struct.pack("<IIQQ", 1, zlib.crc32(b1), 5, len(b1))
    put("snapshot", b"\0" + hdr + b1)
    put("snapshot", b"\0" + hdr + b1[:-1])


if __name__ == "__main__":
    which = set(sys.argv[1:])
    for name, make in [("amount", amounts), ("transfer_body", bodies), ("jwt", jwts),
                       ("graphql", graphql), ("protocol_line", protocol), ("wal_segment", wal),
                       ("snapshot", snapshots)]:
        if not which or name in which:
            make()
