#!/usr/bin/env python3
"""NCCL weight-sync rendezvous through a torch.distributed TCPStore (server/rendezvous/tcpstore.c), driven by
`graphswap store-rendezvous` against tcpstore_fake.FakeStore, whose rank 0 publishes the NCCL
unique id exactly as each framework's trainer does:

- vLLM (vllm/distributed/utils.py StatelessProcessGroup.create + broadcast_obj, and
  vllm/distributed/device_communicators/pynccl.py PyNcclCommunicator): rank 0's TCPStore waits for
  world_size joins ("init/"), then sets "broadcast_from/0/0" = pickle.dumps(ncclUniqueId) (a ctypes
  Structure of c_byte * 128, vllm/distributed/device_communicators/pynccl_wrapper.py), with
  Python's own pickle module and protocols 3, 4, 5. graphswap must join (ADD init/), fetch, unpickle
  and take rank rank_offset; a 3-rank world with two graphswap processes gets one id.
- SGLang (python/sglang/srt/utils.py init_custom_process_group: PrefixStore(group_name, store),
  then torch's _new_process_group_helper PrefixStore(group_name + "/") and PrefixStore("cuda/"),
  then ProcessGroupNCCL::broadcastUniqueNCCLID key "0"): the key is derived here by modelling
  PrefixStore::joinKey (prefix + "/" + key), independently of the C code; rank 0 sets the raw 128
  bytes only after graphswap has joined (the communicator is created at the first collective).
- Refusals, each with a clear message: a pickle of bytes, of another class, of a reduce to
  os.system (nothing runs), a short SGLang id, TRL (graphswap would be rank 0), rank_offset 0, a
  key that never comes (bounded by --id-timeout-ms; the wait is cancelled with CANCEL_WAIT), no
  listener (bounded connect retries), and a peer that is not a TCPStore.
- The NCCL init routes' handler side (`store-rendezvous --init-body`: the same parse and
  rendezvous code as /init_weight_transfer_engine and /init_weights_update_group): vLLM's
  init_info without nccl_unique_id_b64 fetches the id (master_port an int or a string), with it
  touches no store; SGLang joins, then fetches; body errors are 400 naming the field before any
  connection; a store that never publishes is 504 (bounded by timeout_s), one that sends a bad
  pickle 502, with the rendezvous' message.
- TRL (graphswap is rank 0 and hosts the store, `store-rendezvous --framework trl`): a trainer
  client joins and unpickles the id; then N vLLM StatelessProcessGroup barriers (what every
  /update_named_param/ ends with), the trainer's side written from vLLM's source (TRAINER_BARRIER):
  fresh "barrier_<uuid4>" ids under rank 0's broadcast counter 1, 2, ..., graphswap leaving each
  only after the trainer, and no barrier key left behind; a trainer that never arrives is a bounded
  failure with a message.
- With GS_PYTHON_TORCH=<python with torch>, the same vLLM and SGLang cases against a real
  torch.distributed.TCPStore (master, wait_for_workers) and real PrefixStores, and TRL's id and four
  barriers with a real torch TCPStore client as the trainer; skipped with a message otherwise.
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import ctypes
import json
import os
import pickle
import socket
import struct
import subprocess
import sys
import threading
import time
import types

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tcpstore_fake as F  # noqa: E402

BIN = os.environ.get("GS_BIN") or os.path.join(os.environ.get("GS_SOURCE_DIR", "."), "build", "graphswap")
MOD = "vllm.distributed.device_communicators.pynccl_wrapper"

# vLLM's class, under its real module path, so that pickle writes the same stream vLLM's rank 0 does
for name in ("vllm", "vllm.distributed", "vllm.distributed.device_communicators", MOD):
    sys.modules.setdefault(name, types.ModuleType(name))


class ncclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


ncclUniqueId.__module__ = MOD
sys.modules[MOD].ncclUniqueId = ncclUniqueId


class Evil(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


Evil.__module__ = MOD
sys.modules[MOD].Evil = Evil

MARK = os.path.join(os.environ.get("GS_TEST_TMP", "/tmp"), "store-rendezvous-reduce-ran")


class Reducer:
    def __reduce__(self):
        return (os.system, ("touch " + MARK,))


def make_id(seed):
    return bytes((seed * 31 + i * 7) & 0xFF for i in range(128))


def vllm_value(uid, protocol):
    u = ncclUniqueId()
    ctypes.memmove(ctypes.addressof(u), uid, 128)
    v = pickle.dumps(u, protocol=protocol)
    assert bytes(pickle.loads(v)) == uid  # what vLLM's ranks > 0 do with it
    return v


def sglang_key(group):
    """The key ProcessGroupNCCL's rank 0 sets, through the PrefixStore chain, as the TCPStore client
    sends it (keyPrefix_ "/" added by FakeStore.client_set / TCPStore::set)."""
    def join(prefix, key):  # PrefixStore::joinKey
        return prefix + "/" + key
    return join(group, join(group + "/", join("cuda/", "0")))


def start(args, **kw):
    return subprocess.Popen([BIN, "store-rendezvous"] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def finish(p, timeout=30):
    out, err = p.communicate(timeout=timeout)
    lines = [json.loads(x) for x in out.splitlines() if x.strip()]
    return p.returncode, lines, err


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


def args_for(fw, port, rank_offset, world, group=None, extra=()):
    a = ["--framework", fw, "--host", "127.0.0.1", "--port", str(port), "--rank-offset", str(rank_offset),
         "--world-size", str(world), "--timeout-ms", "10000"]
    if group:
        a += ["--group-name", group]
    return a + list(extra)


def check_ok(rc, lines, err, uid, rank, world, fw):
    expect(rc == 0, "%s: exit %d, stderr %r" % (fw, rc, err))
    expect(lines and lines[0] == {"joined": True, "rank": rank}, "%s: first line %r" % (fw, lines))
    last = lines[-1]
    expect(last["unique_id"] == uid.hex(), "%s: id %s != %s" % (fw, last["unique_id"], uid.hex()))
    expect(last["rank"] == rank and last["world_size"] == world and last["framework"] == fw, "%s: %r" % (fw, last))


def test_vllm():
    for proto in (3, 4, 5):
        st = F.FakeStore()
        uid = make_id(proto)
        world = 2

        def rank0():
            st.wait_for_workers(world)  # StatelessProcessGroup.create: TCPStore(world_size=2, is_master=True)
            st.client_set("broadcast_from/0/0", vllm_value(uid, proto))  # PyNcclCommunicator: broadcast_obj

        t = threading.Thread(target=rank0, daemon=True)
        t.start()
        rc, lines, err = finish(start(args_for("vllm", st.port, 1, world)))
        t.join(5)
        check_ok(rc, lines, err, uid, 1, world, "vllm")
        expect(st.data["init/"] == b"2", "init/ = %r" % st.data["init/"])
        expect(st.validated == 1, "VALIDATE count %d" % st.validated)
        qs = [q for q, _ in st.queries]
        expect(qs[:2] == [F.PING, F.ADD] and F.WAIT in qs and qs[-1] == F.GET, "query order %r" % qs)
        expect((F.GET, "/broadcast_from/0/0") in st.queries, "GET key %r" % st.queries)
        expect(lines[-1]["key"] == "/broadcast_from/0/0", lines[-1])
        st.close()
    print("ok vllm protocols 3/4/5")

    # world 3: the trainer and two graphswap processes (rank_offset 1 and 2), one id for both
    st = F.FakeStore()
    uid = make_id(9)

    def rank0_3():
        st.wait_for_workers(3)
        st.client_set("broadcast_from/0/0", vllm_value(uid, pickle.DEFAULT_PROTOCOL))

    t = threading.Thread(target=rank0_3, daemon=True)
    t.start()
    p1 = start(args_for("vllm", st.port, 1, 3))
    p2 = start(args_for("vllm", st.port, 2, 3))
    r1, r2 = finish(p1), finish(p2)
    check_ok(*r1, uid, 1, 3, "vllm")
    check_ok(*r2, uid, 2, 3, "vllm")
    st.close()
    print("ok vllm world 3")


def test_sglang():
    group = "weight_update_group"
    st = F.FakeStore()
    uid = make_id(42)
    world = 2
    p = start(args_for("sglang", st.port, 1, world, group, ["--backend", "nccl"]))
    st.wait_for_workers(world)  # init_custom_process_group -> rendezvous -> TCPStore(world_size) master
    joined = json.loads(p.stdout.readline())
    expect(joined == {"joined": True, "rank": 1}, joined)
    time.sleep(0.3)  # the trainer's first broadcast comes later: graphswap waits for the key
    st.client_set(sglang_key(group), uid)
    rc, lines, err = finish(p)
    lines = [joined] + lines
    check_ok(rc, lines, err, uid, 1, world, "sglang")
    expect(lines[-1]["key"] == "/" + sglang_key(group), "key %r vs %r" % (lines[-1]["key"], sglang_key(group)))
    st.close()
    print("ok sglang (key %s)" % ("/" + sglang_key(group)))


def run_fail(args, setup=None, timeout=30):
    st = F.FakeStore()
    if setup:
        setup(st)
    t0 = time.time()
    rc, lines, err = finish(start(args(st.port)), timeout)
    st.close()
    return rc, err, time.time() - t0, st


def test_refusals():
    uid = make_id(1)
    cases = [
        ("pickled bytes", lambda st: st.client_set("broadcast_from/0/0", pickle.dumps(uid)), "refusing the pickle"),
        ("another class", lambda st: st.client_set("broadcast_from/0/0", pickle.dumps(Evil())), "the class is not"),
        ("reduce to os.system", lambda st: st.client_set("broadcast_from/0/0", pickle.dumps(Reducer())),
         "refusing the pickle"),
        ("truncated pickle", lambda st: st.client_set("broadcast_from/0/0", vllm_value(uid, 4)[:-3]),
         "refusing the pickle"),
    ]
    for name, setup, msg in cases:
        rc, err, _, _ = run_fail(lambda port: args_for("vllm", port, 1, 2), setup)
        expect(rc == 1 and msg in err, "%s: rc %d stderr %r" % (name, rc, err))
    expect(not os.path.exists(MARK), "the reduce ran")

    rc, err, _, _ = run_fail(lambda port: args_for("sglang", port, 1, 2, "g"),
                             lambda st: st.client_set(sglang_key("g"), uid[:64]))
    expect(rc == 1 and "has 64 bytes" in err, err)
    rc, err, _, st = run_fail(lambda port: args_for("trl", port, 1, 2))  # TRL: graphswap hosts, needs the id
    expect(rc != 0 and "--unique-id" in err and st.validated == 0, err)
    rc, err, _, st = run_fail(lambda port: args_for("vllm", port, 0, 2))
    expect(rc == 1 and "rank_offset 0" in err and st.validated == 0, err)
    rc, err, _, _ = run_fail(lambda port: args_for("sglang", port, 1, 2))
    expect(rc == 1 and "group_name" in err, err)
    rc, err, _, _ = run_fail(lambda port: args_for("sglang", port, 1, 2, "g", ["--backend", "gloo"]))
    expect(rc == 1 and "gloo" in err, err)

    # the id never comes: bounded, and the wait is cancelled on the store
    rc, err, dt, st = run_fail(lambda port: args_for("vllm", port, 1, 2, None, ["--id-timeout-ms", "800"]))
    expect(rc == 1 and "timed out" in err and dt < 8, "rc %d dt %.1f %r" % (rc, dt, err))
    expect((F.CANCEL_WAIT, None) in st.queries, "no CANCEL_WAIT: %r" % st.queries)

    # nothing listens: connect retries end at --timeout-ms
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    t0 = time.time()
    rc, _, err = finish(start(["--framework", "vllm", "--host", "127.0.0.1", "--port", str(port), "--rank-offset",
                               "1", "--world-size", "2", "--timeout-ms", "700"]))
    expect(rc == 1 and "cannot connect" in err and time.time() - t0 < 8, err)

    # a peer that is not a TCPStore: it answers the PING with other bytes
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(4)

    def liar():
        c, _ = ls.accept()
        c.recv(10)
        c.sendall(b"HTTP")
        time.sleep(1)
        c.close()

    threading.Thread(target=liar, daemon=True).start()
    rc, _, err = finish(start(["--framework", "vllm", "--host", "127.0.0.1", "--port", str(ls.getsockname()[1]),
                               "--rank-offset", "1", "--world-size", "2", "--timeout-ms", "3000"]))
    expect(rc == 1 and "not a TCPStore" in err, err)
    ls.close()
    print("ok refusals")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_trl_host(port, uid, world=2, timeout_ms=15000, barriers=0):
    p = subprocess.Popen([BIN, "store-rendezvous", "--framework", "trl", "--host", "127.0.0.1", "--port", str(port),
                          "--rank-offset", "0", "--world-size", str(world), "--unique-id", uid.hex(),
                          "--barriers", str(barriers), "--timeout-ms", str(timeout_ms)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    first = json.loads(p.stdout.readline() or "null")
    expect(first == {"hosting": True, "port": port}, "trl host: %r %r" % (first, p.stderr.read() if not first else ""))
    return p


def test_trl():
    """TRL (trl/scripts/vllm_serve.py): graphswap is rank 0 and hosts the store; the trainer is
    rank world_size - 1: StatelessProcessGroup.create(rank=1, world_size=2) = a TCPStore client that
    joins ("init/"), then PyNcclCommunicator's broadcast_obj(None, src=0) = get + pickle.loads."""
    uid = make_id(5)
    port = free_port()
    p = start_trl_host(port, uid)
    # hostile clients first: no VALIDATE, a bad magic, an absurd key length: each is dropped
    for junk in (bytes([F.SET]) + b"\0" * 16, bytes([F.VALIDATE]) + b"\0\0\0\0",
                 bytes([F.VALIDATE]) + struct.pack("<I", F.MAGIC) + bytes([F.GET]) + struct.pack("<Q", 1 << 62)):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(junk)
        s.settimeout(5)
        try:
            got = s.recv(16)
        except ConnectionResetError:  # closed with our bytes unread: RST instead of FIN
            got = b""
        expect(got == b"", "junk %r not dropped" % junk)
        s.close()
    c = F.FakeClient("127.0.0.1", port, world_size=2)
    got = pickle.loads(c.get("broadcast_from/0/0"))
    expect(isinstance(got, ncclUniqueId) and bytes(got) == uid, "trl id %r" % bytes(got)[:8])
    expect(json.loads(p.stdout.readline()) == {"joined": True, "rank": 0}, "trl joined")
    # the store keeps serving (StatelessProcessGroup barriers): set / get / add by the trainer
    c.set("broadcast_from/1/0", pickle.dumps(None))
    expect(pickle.loads(c.get("broadcast_from/1/0")) is None, "trl store roundtrip")
    expect(c.add("cnt", 5) == 5 and c.add("cnt", -2) == 3, "trl add")
    c.close()
    p.stdin.close()
    expect(p.wait(20) == 0, "trl host exit %r" % p.stderr.read())
    # the trainer never joins: bounded
    t0 = time.time()
    p = start_trl_host(free_port(), uid, timeout_ms=1500)
    p.stdin.close()
    rc = p.wait(30)
    expect(rc == 1 and time.time() - t0 < 10 and "did not join" in p.stderr.read(), "trl no trainer rc %d" % rc)
    print("ok trl (graphswap hosts the store)")


# The trainer's side of vLLM's StatelessProcessGroup.barrier() (rank != 0), written from
# vllm-project/vllm@0d4044edd85de30d7d4558aeea4d1e95c7c556d6 vllm/distributed/utils.py (the
# multi-phase barrier of the vLLM >= 0.17 that TRL@f2cd577 requires): broadcast_obj(None, src=0)
# (GET "broadcast_from/0/<n>", unpickled), SET "arrival_<id>_<rank>" = b"1", GET every rank's
# arrival key (GET waits for the key), SET "departure_<id>_<rank>" = b"1"; only rank 0 waits for the
# departures and deletes the keys. The same text runs in-process (FakeClient) and under real torch.
TRAINER_BARRIER = r"""
def trainer_barrier(store, rank, world, counter):
    bid = pickle.loads(store.get("broadcast_from/0/%d" % counter[0]))
    counter[0] += 1
    store.set("arrival_%s_%d" % (bid, rank), b"1")
    for i in range(world):
        store.get("arrival_%s_%d" % (bid, i))
    store.set("departure_%s_%d" % (bid, rank), b"1")
    return bid
"""
exec(TRAINER_BARRIER)
BARRIER_ID = r"^barrier_[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"


def test_trl_barriers():
    """TRL's /update_named_param/ ends with group.barrier() on both sides: graphswap (rank 0, the
    store's host) publishes a fresh "barrier_<uuid4>" per barrier under its next broadcast counter,
    and leaves only once the trainer has arrived and departed; then no barrier key is left in the
    store. A trainer that never arrives fails the barrier within the timeout, with a message."""
    import re
    uid = make_id(9)
    port = free_port()
    p = start_trl_host(port, uid, barriers=3)
    c = F.FakeClient("127.0.0.1", port, world_size=2)
    expect(bytes(pickle.loads(c.get("broadcast_from/0/0"))) == uid, "trl barriers: id")
    expect(json.loads(p.stdout.readline()) == {"joined": True, "rank": 0}, "trl barriers: joined")
    counter, ids = [1], []
    for i in range(3):
        bid = trainer_barrier(c, 1, 2, counter)
        expect(isinstance(bid, str) and re.match(BARRIER_ID, bid) is not None, "barrier id %r" % bid)
        expect(json.loads(p.stdout.readline()) == {"barrier": i + 1}, "graphswap left barrier %d" % (i + 1))
        ids.append(bid)
    expect(len(set(ids)) == 3, "barrier ids repeat: %r" % ids)
    # rank 0 deleted every barrier key (and each barrier's broadcast once all had arrived)
    for bid in ids:
        for k in ("arrival_%s_0" % bid, "arrival_%s_1" % bid, "departure_%s_0" % bid, "departure_%s_1" % bid):
            expect(not c.check([k]), "key %s left in the store" % k)
    for n in (1, 2, 3):
        expect(not c.check(["broadcast_from/0/%d" % n]), "barrier broadcast %d left in the store" % n)
    expect(c.check(["broadcast_from/0/0"]), "the id is kept")
    c.close()
    p.stdin.close()
    expect(p.wait(20) == 0, "trl barriers exit %r" % p.stderr.read())
    # the trainer joins but never arrives at the barrier: bounded, with the reason
    port = free_port()
    p = start_trl_host(port, uid, timeout_ms=1500, barriers=1)
    c = F.FakeClient("127.0.0.1", port, world_size=2)
    t0 = time.time()
    rc = p.wait(30)
    err = p.stderr.read()
    expect(rc == 1 and time.time() - t0 < 10 and "did not reach the barrier" in err, "lost trainer: %d %r" % (rc, err))
    c.close()
    print("ok trl barriers (vLLM StatelessProcessGroup, rank 0)")


def init_body(fw, body, timeout=30):
    p = subprocess.Popen([BIN, "store-rendezvous", "--framework", fw, "--init-body", json.dumps(body)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p


def test_route_rendezvous():
    """The routes' handler-side rendezvous (weights_gpu.c srv_nccl_init_parse / srv_nccl_rendezvous /
    srv_nccl_store_join / srv_nccl_store_fetch) through the --init-body hook."""
    for port_as in (int, str):
        st = F.FakeStore()
        uid = make_id(11)

        def rank0():
            st.wait_for_workers(2)
            st.client_set("broadcast_from/0/0", vllm_value(uid, 4))

        t = threading.Thread(target=rank0, daemon=True)
        t.start()
        ii = {"master_address": "127.0.0.1", "master_port": port_as(st.port), "rank_offset": 1, "world_size": 2,
              "timeout_s": 10}
        rc, lines, err = finish(init_body("vllm", {"init_info": ii}))
        t.join(5)
        expect(rc == 0 and lines, "vllm init-body: rc %d %r %r" % (rc, lines, err))
        got = lines[-1]
        expect(got["status"] == 200 and got["unique_id"] == uid.hex() and got["rank"] == 1 and got["world_size"] == 2,
               "vllm init-body %r" % got)
        expect(got["warmup_all_reduce"] is True and got["unique_id_from"] == "tcpstore" and got["group"] == "vllm", got)
        expect(st.data["init/"] == b"2", "init/ = %r" % st.data["init/"])
        st.close()

    # nccl_unique_id_b64 (the test path): no store is touched, the warm-up is still vLLM's
    st = F.FakeStore()
    uid = make_id(12)
    import base64
    ii = {"master_address": "127.0.0.1", "master_port": st.port, "rank_offset": 1, "world_size": 2,
          "nccl_unique_id_b64": base64.b64encode(uid).decode()}
    rc, lines, err = finish(init_body("vllm", {"init_info": ii}))
    expect(rc == 0 and lines[-1]["unique_id"] == uid.hex() and lines[-1]["unique_id_from"] == "nccl_unique_id_b64"
           and lines[-1]["warmup_all_reduce"] is True, "%r %r" % (lines, err))
    expect(st.accepted == 0, "the id path connected to the store")

    # body errors: 400 naming the field, before any connection
    base = {"master_address": "127.0.0.1", "master_port": st.port, "rank_offset": 1, "world_size": 2}
    bad = [
        ("vllm", {}, "init_info"),
        ("vllm", {"init_info": {k: v for k, v in base.items() if k != "master_address"}}, "init_info.master_address"),
        ("vllm", {"init_info": {k: v for k, v in base.items() if k != "master_port"}}, "init_info.master_port"),
        ("vllm", {"init_info": dict(base, master_port=0)}, "init_info.master_port"),
        ("vllm", {"init_info": dict(base, master_port="29500.0")}, "init_info.master_port"),
        ("vllm", {"init_info": dict(base, master_address="")}, "init_info.master_address"),
        ("vllm", {"init_info": dict(base, rank_offset=0)}, "init_info.rank_offset"),
        ("vllm", {"init_info": dict(base, timeout_s=0)}, "init_info.timeout_s"),
        ("sglang", dict(base, backend="nccl"), "group_name"),
        ("sglang", dict(base, group_name="g\x01"), "group_name"),
        ("sglang", dict(base, group_name="g", backend="gloo"), "backend"),
    ]
    for fw, body, field in bad:
        rc, lines, err = finish(init_body(fw, body))
        expect(rc == 1 and lines and lines[-1]["status"] == 400 and lines[-1]["param"] == field,
               "%s %r: %r %r" % (fw, body, lines, err))
    expect(st.accepted == 0, "a refused body connected to the store (%d)" % st.accepted)
    st.close()

    # SGLang: join at init, the id later (at the trainer's first collective)
    group = "weight_update_group"
    st = F.FakeStore()
    uid = make_id(13)
    p = init_body("sglang", dict(base, master_port=str(st.port), group_name=group, backend="nccl", timeout_s=10))
    st.wait_for_workers(2)
    joined = json.loads(p.stdout.readline())
    expect(joined == {"joined": True, "rank": 1}, joined)
    time.sleep(0.2)
    st.client_set(sglang_key(group), uid)
    rc, lines, err = finish(p)
    expect(rc == 0 and lines[-1]["status"] == 200 and lines[-1]["unique_id"] == uid.hex()
           and lines[-1]["warmup_all_reduce"] is False and lines[-1]["group"] == group, "%r %r" % (lines, err))
    st.close()

    # the id never comes: 504 within timeout_s; a bad pickle: 502; each names the store
    st = F.FakeStore()
    t0 = time.time()
    rc, lines, err = finish(init_body("vllm", {"init_info": dict(base, master_port=st.port, timeout_s=1)}))
    expect(rc == 1 and lines[-1]["status"] == 504 and "127.0.0.1:%d" % st.port in lines[-1]["message"]
           and time.time() - t0 < 10, "timeout: %r" % lines)
    st.close()
    st = F.FakeStore()
    st.client_set("broadcast_from/0/0", pickle.dumps(make_id(1)))
    rc, lines, err = finish(init_body("vllm", {"init_info": dict(base, master_port=st.port, timeout_s=5)}))
    expect(rc == 1 and lines[-1]["status"] == 502 and "refusing the pickle" in lines[-1]["message"], "pickle: %r" % lines)
    st.close()
    # nothing listens: bounded connect retries, 504 or 502 (refused until the deadline)
    port = free_port()
    rc, lines, err = finish(init_body("vllm", {"init_info": dict(base, master_port=port, timeout_s=1)}))
    expect(rc == 1 and lines[-1]["status"] in (502, 504) and "cannot connect" in lines[-1]["message"], "%r" % lines)
    print("ok route rendezvous (--init-body)")


TORCH_TRL = r"""
import ctypes, datetime, pickle, re, sys, types
""" + TRAINER_BARRIER + r"""
from torch.distributed import TCPStore
MOD = "vllm.distributed.device_communicators.pynccl_wrapper"
for n in ("vllm", "vllm.distributed", "vllm.distributed.device_communicators", MOD):
    sys.modules.setdefault(n, types.ModuleType(n))
class ncclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]
ncclUniqueId.__module__ = MOD
sys.modules[MOD].ncclUniqueId = ncclUniqueId
store = TCPStore("127.0.0.1", int(sys.argv[1]), 2, False, datetime.timedelta(seconds=30))
u = pickle.loads(store.get("broadcast_from/0/0"))
assert isinstance(u, ncclUniqueId), type(u)
store.set("broadcast_from/1/0", pickle.dumps(None))
assert store.add("c", 2) == 2 and store.check(["broadcast_from/1/0"]) and not store.check(["nope"])
try:
    store.wait(["nope"], datetime.timedelta(milliseconds=300))
    raise SystemExit("wait did not time out")
except Exception as e:
    assert "timeout" in str(e).lower() or "timed out" in str(e).lower(), e
assert store.get("c") == b"2"
counter = [1]
for i in range(int(sys.argv[2])):
    assert re.match(sys.argv[3], trainer_barrier(store, 1, 2, counter))
print(bytes(u).hex())
"""


TORCH_RANK0 = r"""
import ctypes, datetime, pickle, sys, types
from torch.distributed import TCPStore, PrefixStore
port, fw, world, group, uid = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], bytes.fromhex(sys.argv[5])
store = TCPStore("127.0.0.1", port, world, True, datetime.timedelta(seconds=30))  # waits for the workers
if fw == "vllm":
    MOD = "vllm.distributed.device_communicators.pynccl_wrapper"
    for n in ("vllm", "vllm.distributed", "vllm.distributed.device_communicators", MOD):
        sys.modules.setdefault(n, types.ModuleType(n))
    class ncclUniqueId(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_byte * 128)]
    ncclUniqueId.__module__ = MOD
    sys.modules[MOD].ncclUniqueId = ncclUniqueId
    u = ncclUniqueId()
    ctypes.memmove(ctypes.addressof(u), uid, 128)
    store.set("broadcast_from/0/0", pickle.dumps(u))
else:
    PrefixStore("cuda/", PrefixStore(group + "/", PrefixStore(group, store))).set("0", uid)
sys.stdin.read()  # keep the store up until the test is done
"""


def test_real_torch():
    py = os.environ.get("GS_PYTHON_TORCH")
    if not py:
        print("SKIP real torch.distributed.TCPStore: set GS_PYTHON_TORCH to a python with torch to run it")
        return
    for fw, group in (("vllm", None), ("sglang", "rl_group")):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        uid = make_id(77)
        r0 = subprocess.Popen([py, "-c", TORCH_RANK0, str(port), fw, "2", group or "-", uid.hex()],
                              stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            rc, lines, err = finish(start(args_for(fw, port, 1, 2, group)), 60)
            check_ok(rc, lines, err, uid, 1, 2, fw)
        finally:
            r0.stdin.close()
            r0.wait(30)
        print("ok real torch %s" % fw)
    # TRL: a real torch TCPStore client (the trainer) against graphswap's store server
    port = free_port()
    uid = make_id(88)
    p = start_trl_host(port, uid, barriers=4)
    r = subprocess.run([py, "-c", TORCH_TRL, str(port), "4", BARRIER_ID], capture_output=True, text=True,
                       timeout=120)
    expect(r.returncode == 0 and r.stdout.strip() == uid.hex(), "torch trl: %r %r" % (r.stdout, r.stderr[-2000:]))
    p.stdin.close()
    expect(p.wait(20) == 0, "trl host exit")
    print("ok real torch trl")


def main():
    if os.path.exists(MARK):
        os.remove(MARK)
    os.makedirs(os.path.dirname(MARK), exist_ok=True)
    test_vllm()
    test_sglang()
    test_refusals()
    test_trl()
    test_trl_barriers()
    test_route_rendezvous()
    test_real_torch()
    print("all ok")


if __name__ == "__main__":
    main()
