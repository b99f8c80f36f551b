/* server/rendezvous/le.h — little-endian integers in byte buffers: the TCPStore wire protocol (tcpstore*.c)
 * and the pickle readers (tcpstore_pickle.c, primerl_meta.c) and prime-rl's int64 broadcasts
 * (weights_primerl.c) all use them. */
#ifndef GS_SRV_LE_H
#define GS_SRV_LE_H

#include <stdint.h>

/* the n-byte (n <= 8) little-endian unsigned integer at p */
static inline uint64_t srv_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static inline uint64_t srv_le64(const unsigned char *p) { return srv_le(p, 8); }

static inline void srv_put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

#endif
