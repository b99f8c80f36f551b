/* engine/sha256.h — SHA-256 (FIPS 180-4), for weight checksums (GET /v1/weights/checksums). */
#ifndef GS_ENG_SHA256_H
#define GS_ENG_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t h[8];
    uint64_t len;
    uint8_t buf[64];
    size_t n;
} eng_sha256;

void eng_sha256_init(eng_sha256 *s);
void eng_sha256_update(eng_sha256 *s, const void *data, size_t len);
void eng_sha256_final(eng_sha256 *s, uint8_t out[32]);
/* hex of the digest of data[0..len) into out[65] */
void eng_sha256_hex(const void *data, size_t len, char out[65]);

#endif
