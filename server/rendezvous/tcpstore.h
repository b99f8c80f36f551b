/* server/rendezvous/tcpstore.h — a client of PyTorch's c10d TCPStore, and the rendezvous through it with which
 * the RL frameworks start NCCL weight sync: the trainer (rank 0) hosts the store and publishes the
 * 128-byte ncclUniqueId under a key; graphswap joins as rank rank_offset and fetches it, then hands
 * the id, its rank and the world size to the CUDA transport (engine/backend/transport_cuda.h nccl_init).
 *
 * Wire protocol (all integers in the host's byte order, which torch uses as is — little-endian on
 * every platform graphswap runs on): a request is one QueryType byte then its arguments; a string
 * or byte vector is a uint64 length then the bytes; WAIT/CHECK/MULTI_* carry a uint64 count first.
 * Read from pytorch/pytorch (torch 2.15 headers as shipped in the PyPI wheel, and the sources):
 *   torch/csrc/distributed/c10d/store/TCPStoreBackend.hpp: validationMagicNumber 0x3C85F7CE,
 *     enum QueryType {VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY,
 *     APPEND, MULTI_GET, MULTI_SET, CANCEL_WAIT, PING, QUEUE_PUSH, QUEUE_POP, QUEUE_LEN, LIST_KEYS,
 *     BARRIER}, CheckResponseType {READY, NOT_READY}, WaitResponseType {STOP_WAITING, WAIT_CANCELED}
 *   torch/csrc/distributed/c10d/TCPStore.hpp:171-172: initKey_ = "init/", keyPrefix_ = "/"
 *   cyyever/pytorch@03a5d6dea676f90e0f24d8a14db59f7049eb043f torch/csrc/distributed/c10d/TCPStore.cpp
 *     (same as upstream main): SendBuffer (one command byte, appendString/appendBytes = uint64 size
 *     + bytes, appendValue = raw), the constructor (connect, validate(), ping(), then
 *     waitForWorkers() = ADD initKey_ 1 without keyPrefix_), validate (VALIDATE + uint32 magic, no
 *     reply), ping (PING + uint32 getpid(), the same uint32 back), set/get (get = WAIT then GET on
 *     keyPrefix_ + key), doWait (WAIT; on timeout CANCEL_WAIT and drain STOP_WAITING/WAIT_CANCELED),
 *     add (int64 reply), check (uint8 reply), compareSet (vector reply), deleteKey (int64 reply)
 *   pytorch/pytorch@16c9a1823c4917599a5c8f20854e54dd2c46880d
 *     torch/csrc/distributed/c10d/store/TCPStoreBackend.cpp: the server side of each query (the
 *     first query of a connection must be VALIDATE; getHandler replies with the value vector;
 *     waitHandler replies STOP_WAITING once every key exists; cancelWaitHandler WAIT_CANCELED)
 *
 * Keys given to the srv_store_* calls below are the keys on the wire (no prefix is added): torch's
 * TCPStore::set("k") sends "/k"; srv_store_key() builds the frameworks' keys.
 *
 * Untrusted peer: every length a peer sends is bounded (SRV_STORE_MAX_VALUE), every socket
 * operation has a deadline (connect, send, receive; a WAIT is cancelled at its timeout), and a
 * reply that is not one the protocol allows fails the call with a message.
 */
#ifndef GS_SRV_TCPSTORE_H
#define GS_SRV_TCPSTORE_H

#include <stddef.h>
#include <stdint.h>

#define SRV_STORE_ID_BYTES 128          /* NCCL_UNIQUE_ID_BYTES (nccl.h) */
#define SRV_STORE_MAX_VALUE (1u << 20)  /* a value (GET / COMPARE_SET reply) above this is refused */
#define SRV_STORE_MAX_KEY 1024          /* a key we send */
#define SRV_STORE_MAX_GROUP_NAME 256

/* return codes: 0 success; SRV_STORE_ERR failure (err says why); SRV_STORE_TIMEOUT a deadline
 * passed (err says which operation); SRV_STORE_CLOSED the peer closed the connection */
enum { SRV_STORE_ERR = -1, SRV_STORE_TIMEOUT = -2, SRV_STORE_CLOSED = -3 };

typedef struct srv_store srv_store;

/* Connects to host:port (name or address; IPv4 or IPv6), retrying a refused / unreachable connect
 * with a backoff until timeout_ms has passed (the trainer may bind its store after it asked us to
 * join, as torch's own clients do), then sends VALIDATE and PING and checks the ping's echo.
 * timeout_ms also becomes the per-operation timeout of the connection (srv_store_set_timeout). */
int srv_store_connect(srv_store **out, const char *host, int port, int timeout_ms, char *err, size_t errlen);
void srv_store_close(srv_store *s);
void srv_store_set_timeout(srv_store *s, int timeout_ms);

int srv_store_set(srv_store *s, const char *key, const void *val, size_t len, char *err, size_t errlen);
/* WAIT for key (up to the connection's timeout), then GET it: *val is malloc'ed (free it), *len
 * <= SRV_STORE_MAX_VALUE. */
int srv_store_get(srv_store *s, const char *key, unsigned char **val, size_t *len, char *err, size_t errlen);
/* ADD: the key's value (decimal text) plus delta; *out (may be NULL) the new value */
int srv_store_add(srv_store *s, const char *key, int64_t delta, int64_t *out, char *err, size_t errlen);
/* CHECK: *ready = 1 when every key exists */
int srv_store_check(srv_store *s, const char *const *keys, size_t n, int *ready, char *err, size_t errlen);
/* WAIT until every key exists; SRV_STORE_TIMEOUT after timeout_ms (the wait is cancelled on the
 * server, so the connection stays usable) */
int srv_store_wait(srv_store *s, const char *const *keys, size_t n, int timeout_ms, char *err, size_t errlen);
/* COMPARE_SET: the server's reply (the value now stored, or `expected` when the key is absent and
 * expected is non-empty) in *cur (malloc'ed, may be NULL when *cur_len is 0) */
int srv_store_compare_set(srv_store *s, const char *key, const void *expected, size_t exp_len,
                          const void *desired, size_t des_len, unsigned char **cur, size_t *cur_len,
                          char *err, size_t errlen);
/* DELETE_KEY: *deleted (may be NULL) = 1 when the key existed */
int srv_store_delete(srv_store *s, const char *key, int *deleted, char *err, size_t errlen);

/* ---- the frameworks' rendezvous ---- */

typedef enum {
    SRV_STORE_VLLM,   /* vLLM StatelessProcessGroup + PyNcclCommunicator (vLLM's RLHF examples,
                       * init_weight_update_group / the NCCL weight-transfer engine) */
    SRV_STORE_SGLANG, /* SGLang init_custom_process_group: torch rendezvous tcp:// + ProcessGroupNCCL */
    SRV_STORE_TRL,    /* TRL vllm_serve /init_communicator: graphswap is rank 0 and hosts the store
                       * (srv_store_trl_host; srv_store_join refuses it) */
} srv_store_kind;

typedef struct {
    srv_store_kind kind;
    const char *host;       /* master_address */
    int port;               /* master_port */
    int rank_offset;        /* graphswap's rank = rank_offset + its local rank (0: one process) */
    int world_size;
    const char *group_name; /* SGLang: the group_name of the init body (required); others: unused */
    const char *backend;    /* NULL or "nccl" (SGLang's body field); anything else is refused */
    int timeout_ms;         /* connect + each store operation; the id wait (see srv_store_fetch_id) */
} srv_store_req;

typedef struct srv_store_group srv_store_group;

/* Parses a framework name: "vllm", "sglang", "trl" (0), -1 otherwise. */
int srv_store_kind_parse(const char *name, srv_store_kind *out);
const char *srv_store_kind_name(srv_store_kind k);

/* Builds the wire key under which kind's rank 0 publishes the first NCCL unique id:
 *   vLLM / TRL: "/broadcast_from/0/0" (StatelessProcessGroup.broadcast_obj, src 0, counter 0)
 *   SGLang:     "/" G "/" G "//cuda//0" (PrefixStore(G) over the TCPStore, then
 *               _new_process_group_helper's PrefixStore(G + "/") and PrefixStore("cuda/"), then
 *               ProcessGroupNCCL::broadcastUniqueNCCLID's key ncclCommCounter_ = "0")
 * Returns 0, or -1 when it does not fit in cap or the group name is invalid. */
int srv_store_key(char *buf, size_t cap, srv_store_kind kind, const char *group_name);

/* Phase 1, at the framework's init call: validates req, connects, and joins the store as torch's
 * clients do (ADD "init/" 1: rank 0's TCPStore constructor waits for world_size joins). *rank =
 * rank_offset. Fast: the trainer's own init blocks until we have joined. */
int srv_store_join(const srv_store_req *req, srv_store_group **out, int *rank, char *err, size_t errlen);
/* Phase 2: waits (up to timeout_ms) for rank 0's unique id and decodes it into id. For vLLM the
 * trainer publishes it right after its store is up (PyNcclCommunicator's constructor); for SGLang
 * only at its first collective on the group (ProcessGroupNCCL creates communicators lazily), i.e.
 * the first update_weights_from_distributed broadcast, so call this when that update begins. */
int srv_store_fetch_id(srv_store_group *g, unsigned char id[SRV_STORE_ID_BYTES], int timeout_ms,
                       char *err, size_t errlen);
void srv_store_group_close(srv_store_group *g);

/* 1 when the framework's ranks run a warm-up collective right after ncclCommInitRank, which
 * graphswap must match before the first weight broadcast (NCCL pairs collectives in order): vLLM's
 * PyNcclCommunicator.__init__ (vllm-project/vllm@0531c2226a6a25cd96ccc856f3bda3f0bb4efb5f
 * vllm/distributed/device_communicators/pynccl.py: "A small all_reduce for warmup",
 * all_reduce(torch.zeros(1)) = ncclAllReduce of one float32, ncclSum, in place) — also on vLLM's
 * nccl_unique_id_b64 path (PyNcclCommunicator.from_unique_id_bytes). SGLang's ProcessGroupNCCL runs
 * none (its first collective is the trainer's first broadcast). */
int srv_store_warmup_allreduce(srv_store_kind kind);

/* master_port as the init bodies carry it, an int or a decimal string ("29500"): 1..65535, digits
 * only. Returns 0, -1 otherwise. */
int srv_store_parse_port(const char *text, int *port);

/* join + fetch_id (timeout req->timeout_ms) + close. */
int srv_store_rendezvous(const srv_store_req *req, unsigned char id[SRV_STORE_ID_BYTES], int *rank,
                         char *err, size_t errlen);

/* ---- a TCPStore server (server/rendezvous/tcpstore_server.c), for graphswap as rank 0 (TRL) ---- */

typedef struct srv_store_server srv_store_server;

/* Listens on host:port (host NULL / "" / "0.0.0.0": all IPv4 interfaces; port 0: an ephemeral one)
 * and serves the protocol above from background threads until srv_store_server_stop. */
int srv_store_server_start(srv_store_server **out, const char *host, int port, char *err, size_t errlen);
int srv_store_server_port(const srv_store_server *sv);
/* local operations on the served table (wire keys, as the srv_store_* client calls) */
int srv_store_server_set(srv_store_server *sv, const char *key, const void *val, size_t len);
int srv_store_server_add(srv_store_server *sv, const char *key, int64_t delta, int64_t *out);
/* waits until key's decimal value is >= target (e.g. "init/" reaching world_size: every worker
 * joined); SRV_STORE_TIMEOUT after timeout_ms */
int srv_store_server_wait_count(srv_store_server *sv, const char *key, int64_t target, int timeout_ms);
/* waits until every key exists; SRV_STORE_TIMEOUT after timeout_ms */
int srv_store_server_wait_keys(srv_store_server *sv, const char *const *keys, size_t n, int timeout_ms);
/* 1 when key existed (it is gone now), else 0 */
int srv_store_server_delete(srv_store_server *sv, const char *key);
void srv_store_server_stop(srv_store_server *sv);

/* TRL's /init_communicator {host, port, world_size}: graphswap is rank 0 (see SRV_STORE_TRL). Starts
 * the store on host:port and publishes id (ncclGetUniqueId's 128 bytes, made by the caller) as rank
 * 0's broadcast_obj does: "/broadcast_from/0/0" = pickle.dumps(ncclUniqueId), protocol 4. The
 * trainer (rank world_size - 1) joins, fetches it and calls ncclCommInitRank; keep the server until
 * the group is closed (the trainer's StatelessProcessGroup uses the store for its barriers, see
 * srv_store_trl_barrier; the next broadcast counter of rank 0 is 1). */
int srv_store_trl_host(const srv_store_req *req, const unsigned char id[SRV_STORE_ID_BYTES],
                       srv_store_server **out, char *err, size_t errlen);

/* Rank 0's side of one vLLM StatelessProcessGroup.barrier() on the store it hosts: TRL's trainer
 * runs `group.barrier()` after each /update_named_param/ broadcast, and vLLM's worker (rank 0) the
 * same, after receiving it. This is the multi-phase barrier of vLLM's vllm/distributed/utils.py
 * StatelessProcessGroup (vllm-project/vllm@0d4044edd85de30d7d4558aeea4d1e95c7c556d6, read in a copy
 * with that attribution; TRL@f2cd577 imports vLLM's and requires vllm>=0.17.0,<=0.25.1 in its
 * pyproject.toml). vLLM before it (e.g. @5a6541db9bfa77756459722f69e8c89a0b47a14d) had a barrier of
 * one broadcast_obj(None) per rank, which this does not serve:
 *   rank 0: barrier_id = "barrier_" + str(uuid4()); broadcast_obj(barrier_id, src=0), i.e. SET
 *     "broadcast_from/0/<counter>" = pickle.dumps(barrier_id) (counter *bcast_n: 0 was the NCCL
 *     id, one more per barrier);
 *   every rank: SET "arrival_<id>_<rank>" = b"1", then GET each "arrival_<id>_<i>" (GET waits);
 *     SET "departure_<id>_<rank>" = b"1"; rank 0 also waits for every "departure_<id>_<i>" and then
 *     deletes the arrival and departure keys.
 * (Keys on the wire carry torch's "/" prefix.) Here rank 0 also deletes its broadcast key once every
 * rank has arrived (each read it to name its arrival key), where vLLM leaves it for its hour of
 * data expiration. Each wait is bounded by timeout_ms. 0, SRV_STORE_TIMEOUT or SRV_STORE_ERR. */
int srv_store_trl_barrier(srv_store_server *sv, int world_size, int64_t *bcast_n, int timeout_ms, char *err,
                          size_t errlen);

/* The strict unpickler for vLLM's broadcast of the id: accepts exactly pickle.dumps(ncclUniqueId())
 * with protocol 3, 4 or 5, i.e. the reduction of a ctypes Structure (CPython Modules/_ctypes/
 * _ctypes.c PyCData_reduce: (_ctypes._unpickle, (cls, (obj.__dict__, bytes(obj))))) where cls is
 * vllm.distributed.device_communicators.pynccl_wrapper.ncclUniqueId, __dict__ is empty and the
 * bytes are 128 long. Anything else (another class or module, another opcode, trailing data) is
 * refused with a message. */
int srv_store_unpickle_nccl_id(const unsigned char *p, size_t n, unsigned char id[SRV_STORE_ID_BYTES],
                               char *err, size_t errlen);

#endif
