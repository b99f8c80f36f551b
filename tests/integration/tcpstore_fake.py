"""A stand-in for torch.distributed.TCPStore's server (and its rank-0 client), written from torch's
source, not from graphswap's client (server/rendezvous/tcpstore.c), so the two check each other.

The server side follows pytorch/pytorch@16c9a1823c4917599a5c8f20854e54dd2c46880d
torch/csrc/distributed/c10d/store/TCPStoreBackend.cpp:
  - TCPStoreMasterDaemon::query: one QueryType byte, then the handler; a connection's first query
    must be VALIDATE ("Miscellaneous client without VALIDATE query is detected"), else it is dropped
  - validateHandler: a uint32 that must equal validationMagicNumber (0x3C85F7CE), no reply
  - pingHandler: a uint32 nonce, sent back
  - setHandler / getHandler / addHandler / checkHandler / waitHandler / deleteHandler /
    getNumKeysHandler / compareSetHandler / cancelWaitHandler / multiGetHandler / multiSetHandler /
    appendHandler, with tcputil's framing: a string or vector is a size_t (uint64) length and the
    bytes, a value is raw bytes in host order; WAIT / CHECK / MULTI_* carry a SizeType (uint64) count
  - addHandler keeps the value as decimal text and replies with the int64 sum
  - waitHandler replies STOP_WAITING (0) at once when every key exists, else when the last missing
    key is set or added; cancelWaitHandler forgets the wait and replies WAIT_CANCELED (1)
The enum values are torch/csrc/distributed/c10d/store/TCPStoreBackend.hpp's (torch 2.15 wheel).

The client helpers mimic torch's TCPStore on rank 0 (TCPStore.cpp): every key a Python caller
gives gets keyPrefix_ "/", and waitForWorkers adds 1 to "init/" (no prefix) and waits until it
reaches world_size.
"""
import select
import socket
import struct
import threading
import time

VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND, MULTI_GET, \
    MULTI_SET, CANCEL_WAIT, PING, QUEUE_PUSH, QUEUE_POP, QUEUE_LEN, LIST_KEYS, BARRIER = range(19)
READY, NOT_READY = 0, 1
STOP_WAITING, WAIT_CANCELED = 0, 1
MAGIC = 0x3C85F7CE


class _Closed(Exception):
    pass


def _recv(conn, n):
    out = b""
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            raise _Closed()
        out += chunk
    return out


def _u64(conn):
    return struct.unpack("<Q", _recv(conn, 8))[0]


def _vec(conn):
    n = _u64(conn)
    if n > (64 << 20):
        raise _Closed()
    return _recv(conn, n)


class FakeStore:
    """A threaded TCPStore server on 127.0.0.1 (port 0: a free one)."""

    def __init__(self, port=0, host="127.0.0.1"):
        self.data = {}
        self.cv = threading.Condition()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.queries = []  # (query type, key or None) in arrival order, for the tests
        self.validated = 0
        self.accepted = 0  # connections accepted (a route that must not touch the network leaves 0)
        self.stop = False
        self.t = threading.Thread(target=self._accept, daemon=True)
        self.t.start()

    def close(self):
        """Stops listening for good: shutdown() first wakes the accept() of the serving thread (a
        bare close() from another thread leaves the kernel socket listening until that accept
        returns, so a later client of the port could still reach this store and its keys)."""
        self.stop = True
        with self.cv:
            self.data.clear()
        for f in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close):
            try:
                f()
            except OSError:
                pass
        self.t.join(5)

    def _accept(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        try:
            q = _recv(conn, 1)[0]
            if q != VALIDATE:
                return  # TCPStoreMasterDaemon::query drops a client whose first query is not VALIDATE
            if struct.unpack("<I", _recv(conn, 4))[0] != MAGIC:
                return
            with self.cv:
                self.validated += 1
            while True:
                q = _recv(conn, 1)[0]
                self._query(conn, q)
        except (_Closed, OSError):
            pass
        finally:
            conn.close()

    def _log(self, q, key=None):
        with self.cv:
            self.queries.append((q, key))

    def _query(self, conn, q):
        if q == PING:
            nonce = _recv(conn, 4)
            self._log(q)
            conn.sendall(nonce)
        elif q == SET:
            key = _vec(conn).decode()
            val = _vec(conn)
            self._log(q, key)
            with self.cv:
                self.data[key] = val
                self.cv.notify_all()
        elif q == GET:
            key = _vec(conn).decode()
            self._log(q, key)
            with self.cv:
                val = self.data.get(key)
            if val is None:
                raise _Closed()  # getHandler: tcpStore_.at(key) throws, the connection is dropped
            conn.sendall(struct.pack("<Q", len(val)) + val)
        elif q == ADD:
            key = _vec(conn).decode()
            delta = struct.unpack("<q", _recv(conn, 8))[0]
            self._log(q, key)
            with self.cv:
                v = int(self.data.get(key, b"0").decode()) + delta
                self.data[key] = str(v).encode()
                self.cv.notify_all()
            conn.sendall(struct.pack("<q", v))
        elif q in (CHECK, WAIT):
            n = _u64(conn)
            keys = [_vec(conn).decode() for _ in range(n)]
            self._log(q, keys[0] if keys else None)
            if q == CHECK:
                with self.cv:
                    ok = all(k in self.data for k in keys)
                conn.sendall(bytes([READY if ok else NOT_READY]))
                return
            self._wait(conn, keys)
        elif q == CANCEL_WAIT:
            self._log(q)
            conn.sendall(bytes([WAIT_CANCELED]))
        elif q == DELETE_KEY:
            key = _vec(conn).decode()
            self._log(q, key)
            with self.cv:
                n = 1 if self.data.pop(key, None) is not None else 0
            conn.sendall(struct.pack("<q", n))
        elif q == GETNUMKEYS:
            self._log(q)
            with self.cv:
                n = len(self.data)
            conn.sendall(struct.pack("<q", n))
        elif q == COMPARE_SET:
            key = _vec(conn).decode()
            cur = _vec(conn)
            new = _vec(conn)
            self._log(q, key)
            with self.cv:
                if key not in self.data:
                    if cur == b"":
                        self.data[key] = new
                        reply = new
                    else:
                        reply = cur
                else:
                    if self.data[key] == cur:
                        self.data[key] = new
                    reply = self.data[key]
                self.cv.notify_all()
            conn.sendall(struct.pack("<Q", len(reply)) + reply)
        else:
            raise _Closed()  # "Unexpected query type"

    def _wait(self, conn, keys):
        """WAIT blocks this connection's thread until the keys exist; meanwhile the client may send
        CANCEL_WAIT (TCPStore::doWait after its timeout), which is answered WAIT_CANCELED."""
        while True:
            with self.cv:
                if all(k in self.data for k in keys):
                    conn.sendall(bytes([STOP_WAITING]))
                    return
                self.cv.wait(0.02)
            r, _, _ = select.select([conn], [], [], 0)
            if r:
                q = _recv(conn, 1)[0]
                if q != CANCEL_WAIT:
                    raise _Closed()
                self._log(q)
                conn.sendall(bytes([WAIT_CANCELED]))
                return

    # ---- rank 0's side, as torch's TCPStore client on the master would do it ----

    def client_set(self, key, value):
        """TCPStore::set(key): stored under keyPrefix_ + key."""
        with self.cv:
            self.data["/" + key] = value
            self.cv.notify_all()

    def wait_for_workers(self, world_size, timeout=30.0):
        """TCPStore::waitForWorkers on the master: its own increment of "init/", then wait for all."""
        with self.cv:
            v = int(self.data.get("init/", b"0").decode()) + 1
            self.data["init/"] = str(v).encode()
            self.cv.notify_all()
            end = time.time() + timeout
            while int(self.data["init/"].decode()) < world_size:
                if time.time() > end:
                    raise TimeoutError("workers did not join: init/ = %r" % self.data["init/"])
                self.cv.wait(0.05)


class FakeClient:
    """torch's TCPStore client (TCPStore.cpp), for the flows where graphswap hosts the store (TRL):
    connect, validate() (VALIDATE + magic), ping() (PING + nonce, echoed), then the queries with
    keyPrefix_ "/" added to the caller's keys (not to "init/", as waitForWorkers sends it)."""

    def __init__(self, host, port, timeout=10.0, world_size=None):
        end = time.time() + timeout
        while True:
            try:
                self.s = socket.create_connection((host, port), timeout=timeout)
                break
            except OSError:
                if time.time() > end:
                    raise
                time.sleep(0.05)
        self.s.settimeout(timeout)
        nonce = 0x1234ABCD
        self.s.sendall(bytes([VALIDATE]) + struct.pack("<I", MAGIC) + bytes([PING]) + struct.pack("<I", nonce))
        if struct.unpack("<I", _recv(self.s, 4))[0] != nonce:
            raise RuntimeError("ping")
        if world_size is not None:
            self._add("init/", 1)  # waitForWorkers on a non-master: its increment only

    def _add(self, wire_key, delta):
        k = wire_key.encode()
        self.s.sendall(bytes([ADD]) + struct.pack("<Q", len(k)) + k + struct.pack("<q", delta))
        return struct.unpack("<q", _recv(self.s, 8))[0]

    def add(self, key, delta):
        return self._add("/" + key, delta)

    def set(self, key, value):
        k = ("/" + key).encode()
        self.s.sendall(bytes([SET]) + struct.pack("<Q", len(k)) + k + struct.pack("<Q", len(value)) + value)

    def get(self, key):
        """TCPStore::get: doWait (WAIT, STOP_WAITING) then GET."""
        k = ("/" + key).encode()
        self.s.sendall(bytes([WAIT]) + struct.pack("<Q", 1) + struct.pack("<Q", len(k)) + k)
        if _recv(self.s, 1)[0] != STOP_WAITING:
            raise RuntimeError("wait")
        self.s.sendall(bytes([GET]) + struct.pack("<Q", len(k)) + k)
        n = struct.unpack("<Q", _recv(self.s, 8))[0]
        return _recv(self.s, n)

    def check(self, keys):
        """TCPStore::check: CHECK of the prefixed keys, READY when all exist."""
        msg = bytes([CHECK]) + struct.pack("<Q", len(keys))
        for key in keys:
            k = ("/" + key).encode()
            msg += struct.pack("<Q", len(k)) + k
        self.s.sendall(msg)
        return _recv(self.s, 1)[0] == READY

    def close(self):
        self.s.close()
