/* model/rope.c — RoPE / YaRN frequency tables and the interleaved pair rotation (MODEL_SPEC §3.3).
 *
 * The arithmetic mirrors DeepSeek's reference table construction step by step, in fp32 where it is
 * fp32 there (frequencies, ramp, blend, the angle product) and in double where it is Python floats
 * there (the YaRN correction range). cos and sin are taken of the fp32 angle, evaluated in double and
 * rounded once, i.e. the best fp32 value of cos/sin of that angle. */
#include <math.h>

#include "model/rope.h"
#include "trex/status.h"

void trex_rope_freqs(float *freq, int64_t r, double theta, bool yarn, double factor,
                     int64_t orig_len, double beta_fast, double beta_slow)
{
    TREX_ASSERT(r >= 2 && r % 2 == 0 && theta > 0.0);
    const int64_t half = r / 2;
    const float base = (float)theta;
    for (int64_t i = 0; i < half; i++) {
        /* torch: 1.0 / (base ** (arange(0, r, 2, float32) / r)) */
        float ex = (float)(2 * i) / (float)r;
        freq[i] = 1.0f / powf(base, ex);
    }
    if (!yarn)
        return;
    TREX_ASSERT(factor > 0.0 && orig_len > 0 && beta_fast > 0.0 && beta_slow > 0.0);
    /* Correction range in double (Python math): g(b) = r ln(L0 / (2 pi b)) / (2 ln theta). */
    const double pi = 3.14159265358979323846;
    double g_fast = (double)r * log((double)orig_len / (beta_fast * 2.0 * pi)) / (2.0 * log(theta));
    double g_slow = (double)r * log((double)orig_len / (beta_slow * 2.0 * pi)) / (2.0 * log(theta));
    double lo = floor(g_fast), hi = ceil(g_slow);
    if (lo < 0.0)
        lo = 0.0;
    if (hi > (double)(r - 1))
        hi = (double)(r - 1);
    if (hi == lo)
        hi += 0.001;
    const float flo = (float)lo, span = (float)(hi - lo), fs = (float)factor;
    for (int64_t i = 0; i < half; i++) {
        float ramp = ((float)i - flo) / span;
        ramp = ramp < 0.0f ? 0.0f : (ramp > 1.0f ? 1.0f : ramp);
        float smooth = 1.0f - ramp;
        /* torch: freqs / factor * (1 - smooth) + freqs * smooth, each op in fp32 */
        freq[i] = freq[i] / fs * (1.0f - smooth) + freq[i] * smooth;
    }
}

void trex_rope_layer_freqs(float *freq, const trex_config *cfg, int ratio)
{
    if (ratio == 0)
        trex_rope_freqs(freq, cfg->qk_rope_head_dim, cfg->rope_theta, false, 1.0, 0, 0.0, 0.0);
    else
        trex_rope_freqs(freq, cfg->qk_rope_head_dim, cfg->compress_rope_theta, cfg->yarn,
                        cfg->rope_factor, cfg->rope_original_max_pos, cfg->rope_beta_fast,
                        cfg->rope_beta_slow);
}

void trex_rope_table(float *cos_t, float *sin_t, const float *freq, int64_t half, int64_t npos)
{
    for (int64_t p = 0; p < npos; p++) {
        for (int64_t i = 0; i < half; i++) {
            float ang = (float)p * freq[i]; /* fp32 product, as torch.outer(t, freqs) */
            cos_t[p * half + i] = (float)cos((double)ang);
            sin_t[p * half + i] = (float)sin((double)ang);
        }
    }
}

void trex_rope_rotate(float *v, const float *cs, const float *sn, int64_t half, bool inverse)
{
    for (int64_t i = 0; i < half; i++) {
        const float a = v[2 * i], b = v[2 * i + 1];
        const float c = cs[i], s = inverse ? -sn[i] : sn[i];
        /* (a + ib)(c + is) */
        v[2 * i] = a * c - b * s;
        v[2 * i + 1] = a * s + b * c;
    }
}
