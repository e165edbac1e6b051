/* model/rope.h — rotary position embedding tables (plain and YaRN) and the pair rotation.
 *
 * DeepSeek-V4 rotates the last r = qk_rope_head_dim dims of a vector as r/2 adjacent pairs
 * (u[2i], u[2i+1]) (interleaved layout), pair i by the angle pos * f_i. The tables are built in fp32
 * exactly as docs/model-conventions.md ("Numerics that must match exactly") prescribes, so that trex
 * and the PyTorch reference agree to the last bits of the angle. Tables depend only on the position,
 * never on the document, so one table up to the longest document serves a whole batch. */
#ifndef TREX_MODEL_ROPE_H
#define TREX_MODEL_ROPE_H

#include <stdbool.h>
#include <stdint.h>

#include "trex/config.h"

/* freq[half] = the per-pair frequencies of a layer with compress ratio `ratio`, half = r/2:
 * ratio 0 uses rope_theta without YaRN; ratio > 0 uses compress_rope_theta with the YaRN correction
 * (when cfg->yarn). */
void trex_rope_layer_freqs(float *freq, const trex_config *cfg, int ratio);

/* The same from explicit parameters: f_i = 1 / theta^(2i/r) in fp32; with yarn, MODEL_SPEC §3.3's
 * ramp between f_i (low pairs) and f_i / factor (high pairs) over the correction range of the
 * original context length orig_len and the rotation counts beta_fast, beta_slow. */
void trex_rope_freqs(float *freq, int64_t r, double theta, bool yarn, double factor,
                     int64_t orig_len, double beta_fast, double beta_slow);

/* cos_t, sin_t [npos, half]: cos/sin of the fp32 angle (float)pos * freq[i], pos = 0..npos-1. */
void trex_rope_table(float *cos_t, float *sin_t, const float *freq, int64_t half, int64_t npos);

/* Rotates the 2*half values at v pair by pair by the angles of one table row (cs, sn): by +angle,
 * or by -angle (the conjugate) when inverse. The backward of a rotation is the opposite rotation. */
void trex_rope_rotate(float *v, const float *cs, const float *sn, int64_t half, bool inverse);

#endif
