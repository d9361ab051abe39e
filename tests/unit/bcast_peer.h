/* Raw peers of the host transport for tests: a client or a fake root that
 * speak the wire format bcast_host.c documents, written here from that
 * description (the HMACs with OpenSSL directly, not with the engine's
 * helpers), so a test checks the protocol and not the code against itself.
 * Every call is bounded: sockets get 5 s receive and send timeouts. */
#ifndef RLORCH_TESTS_BCAST_PEER_H
#define RLORCH_TESTS_BCAST_PEER_H

#include <stddef.h>
#include <stdint.h>

#include "workers/bcast/bcast.h"

#define BP_NONCE 32
#define BP_MAC 32
#define BP_CHALLENGE 40

/* A 2-D sender tensor [d0, d1] of storage dtype st and wire dtype wt, its
 * data malloc'd and filled from the xorshift state *rng: fp32 mostly finite
 * and near the fp16 range, and with `specials` NaNs and subnormals among
 * them (every 97th and 89th element); 16-bit storage any bit pattern. */
void bp_random_tensor(bcast_tensor *t, const char *name, uint32_t layer, bcast_dtype st,
                      bcast_dtype wt, uint64_t d0, uint64_t d1, bcast_residency res,
                      int specials, uint32_t *rng);

/* Reference wire bytes of one whole sender tensor, cast element by element
 * with the scalar casts (a 16-bit storage copied): what every receiver must
 * hold after the broadcast. malloc'd, 2 bytes per element. */
void *bp_reference(const bcast_tensor *t);

/* A connected loopback TCP client of addr ("127.0.0.1:port"), or -1. */
int bp_dial(const char *addr);
/* Reads exactly n bytes; 0, or -1 (closed, error, timeout). */
int bp_read(int fd, void *buf, size_t n);
/* Reads until the peer closes (or 5 s pass); the bytes read, at most cap. */
size_t bp_read_to_end(int fd, uint8_t *buf, size_t cap);
/* Reads the root's challenge: its nonce. 0, or -1 when none came. */
int bp_challenge(int fd, uint8_t nonce[BP_NONCE]);

/* The HELLO a receiver of plan p with `rank` sends for root nonce `nonce`,
 * its proof made with `secret` (p->secret for a real one); rx_nonce is
 * written. Returns the length. */
size_t bp_hello(uint8_t *out, const bcast_plan *p, uint32_t rank, const uint8_t *secret,
                const uint8_t nonce[BP_NONCE], uint8_t rx_nonce[BP_NONCE]);
/* Challenge in, hello out (with p's own secret): a receiver that holds the plan. */
int bp_handshake(int fd, const bcast_plan *p, uint32_t rank, uint8_t rx_nonce[BP_NONCE]);
/* The root's reply status after a hello: 0 with a valid root proof, the
 * status when the root refused, 1 when nothing came (the connection closed),
 * 2 when the proof is wrong. */
int bp_reply(int fd, const bcast_plan *p, uint32_t rank, const uint8_t nonce[BP_NONCE],
             const uint8_t rx_nonce[BP_NONCE]);

/* Fake root side: sends a challenge (nonce given), reads a hello into
 * buf (its length in *len). 0, or -1. */
int bp_root_challenge(int fd, const uint8_t nonce[BP_NONCE]);
int bp_root_read_hello(int fd, uint8_t *buf, size_t cap, size_t *len);
/* Sends REPLY 0 with the root's proof over (nonce, the hello's rx_nonce)
 * made with `secret`. */
int bp_root_accept(int fd, const bcast_plan *p, const uint8_t *secret, const uint8_t nonce[BP_NONCE],
                   const uint8_t *hello);

void bp_put32(uint8_t *b, uint32_t v);
void bp_put64(uint8_t *b, uint64_t v);
uint32_t bp_get32(const uint8_t *b);

#endif
