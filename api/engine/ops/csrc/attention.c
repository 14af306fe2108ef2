/* CachedAttention (domain "tokenshop"): ONNX Runtime's GroupQueryAttention over a KV cache that
 * past and present share, for the CPU: the same inputs, outputs and semantics (right-padded rows,
 * `seqlens_k` = each row's total length - 1, rotary from cos/sin caches, non-interleaved), with
 * the query scale as the `scale` attribute, q, k, v optionally packed in one tensor, and left
 * padding: a row whose total is less than the call's S new tokens has that many fewer, at the
 * end, after padding tokens that are not cached, attended to or attending (their output is 0).
 * So prompts of different lengths are prefilled in one call, each row's last token last (the
 * engine's graph returns only the last position's logits).
 *
 * Why: ONNX Runtime's CPU kernel runs two SGEMM calls per sequence and query head, each a few
 * thousand multiplies. Here the query heads that share a KV head are one tile of 8 lanes (a lane
 * per query row), so each cached key and value is read once for all of them, and the softmax is
 * online over blocks of keys (flash attention's order), so no score matrix is stored. Figures:
 * bench/results/2026-11-26-kernel-notes.md.
 *
 * Inputs (GroupQueryAttention's order):
 *   0 query       [B, S, H * D], or q, k, v packed as [B, S, (H + 2 KV) * D] with 1 and 2 absent
 *   1 key, 2 value [B, S, KV * D]
 *   3 past_key, 4 past_value  [B, KV, C, D]
 *   5 seqlens_k   int32 [B]: row b's total length (past + S new tokens) minus one
 *   6 total_sequence_length  int32 scalar: the longest row's total
 *   7 cos_cache, 8 sin_cache [positions, D / 2], optional: rotate q and k at their positions
 * Outputs: 0 [B, S, H * D]; 1 present_key, 2 present_value [B, KV, max(C, total), D]. When a
 * present is bound to its past's buffer (the engine's I/O binding, `runtime/slot_batch.py`), the new keys
 * and values are written into it in place; otherwise the past is copied into the present first.
 * Attributes: num_heads, kv_num_heads, scale (float, default 1/sqrt(D)).
 * Supported: float32, D a multiple of 8 up to 256 (even with rotary), H a multiple of KV.
 * CachedAttentionHalfCache is the same op over float16 past and present (ENGINE_KV_CACHE_DTYPE):
 * new keys and values are rounded to float16 as they are stored and widened as they are read,
 * so a long context's step reads half the bytes; the arithmetic stays float32.
 *
 * AVX2 + FMA (and F16C, which every AVX2 CPU has) only, so one build serves every CPU the
 * library runs on: attention is a small part of a step once its calls are few, and a 16-lane
 * tile would leave more lanes idle (7 query heads share a KV head on Qwen2.5-0.5B's shape).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "simd_math.h"

#define LANES 8        /* query rows per tile: one vector of scores per key */
#define KEY_BLOCK 64   /* keys scored before their values are summed (online softmax step) */
#define MAX_DIM 256    /* head dims the tile's on-stack buffers hold */

#define TARGET __attribute__((target("avx2,fma,f16c")))

typedef struct {
  int64_t heads, kv_heads;
  float scale;    /* 0: 1 / sqrt(D) */
  int half_cache; /* whether past and present hold float16 */
} AttentionKernel;

/* Where one call's tensors are, and their sizes. */
typedef struct {
  const float *q, *k, *v;      /* the new tokens' first q, k, v row */
  int64_t q_stride, kv_stride; /* floats from one token's q (k, v) to the next token's */
  void *keys, *values;    /* present [B][KV][capacity][D], float or float16 (`half`) */
  int half;
  const int32_t *seqlens;
  const float *cos, *sin; /* [positions][D / 2], or NULL */
  float *out;
  int64_t batch, tokens, heads, kv_heads, dim, capacity;
  float scale;
  int64_t tiles; /* tiles of LANES query rows per (row, KV head) */
} Attention;

/* ---- rotary ---- */

/* y = x rotated to `position` (the half-split layout: x[i] pairs with x[i + D / 2]), times
 * `scale`; a copy when there is no rotary cache. */
static void rotate(const Attention *a, const float *x, int64_t position, float scale, float *y) {
  int64_t half = a->dim / 2;
  if (a->cos == NULL) {
    for (int64_t i = 0; i < a->dim; i++) y[i] = x[i] * scale;
    return;
  }
  const float *c = a->cos + position * half, *s = a->sin + position * half;
  for (int64_t i = 0; i < half; i++) {
    float x1 = x[i], x2 = x[i + half];
    y[i] = (x1 * c[i] - x2 * s[i]) * scale;
    y[i + half] = (x2 * c[i] + x1 * s[i]) * scale;
  }
}

/* Tokens row `row` had cached before this call; negative: minus its left padding. */
static int64_t past_length(const Attention *a, int64_t row) {
  return (int64_t)a->seqlens[row] + 1 - a->tokens;
}

/* The row's first new token that is not padding. */
static int64_t first_token(const Attention *a, int64_t row) {
  int64_t past = past_length(a, row);
  return past < 0 ? -past : 0;
}

static size_t element_bytes(const Attention *a) { return a->half ? 2 : sizeof(float); }

static void *cache_row(const Attention *a, void *cache, int64_t row, int64_t head) {
  size_t at = (size_t)((row * a->kv_heads + head) * a->capacity * a->dim);
  return (char *)cache + at * element_bytes(a);
}

/* `x` (D floats) into the cache at `to`, as float16 (rounded to nearest) in a half cache. */
TARGET static void store_row(const Attention *a, const float *x, void *to) {
  if (!a->half) {
    memcpy(to, x, (size_t)a->dim * sizeof(float));
    return;
  }
  for (int64_t d = 0; d < a->dim; d += 8)
    _mm_storeu_si128((__m128i *)((uint16_t *)to + d),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + d), _MM_FROUND_TO_NEAREST_INT));
}

/* `n` cached rows from `from` as floats: the cache itself, or converted into `buffer`. */
TARGET static const float *float_rows(const Attention *a, const void *from, int64_t n,
                                      float *buffer) {
  if (!a->half) return from;
  const uint16_t *halves = from;
  for (int64_t i = 0; i < n * a->dim; i += 8)
    _mm256_storeu_ps(buffer + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(halves + i))));
  return buffer;
}

/* The new tokens' keys (rotated) and values into the cache, before any query reads them. */
static void append(const Attention *a) {
  int64_t d = a->dim;
  size_t row_bytes = (size_t)d * element_bytes(a);
  float key[MAX_DIM];
  for (int64_t b = 0; b < a->batch; b++) {
    int64_t past = past_length(a, b);
    for (int64_t s = first_token(a, b); s < a->tokens; s++) {
      int64_t token = b * a->tokens + s;
      for (int64_t h = 0; h < a->kv_heads; h++) {
        char *keys = cache_row(a, a->keys, b, h), *values = cache_row(a, a->values, b, h);
        rotate(a, a->k + token * a->kv_stride + h * d, past + s, 1.0f, key);
        store_row(a, key, keys + (past + s) * row_bytes);
        store_row(a, a->v + token * a->kv_stride + h * d, values + (past + s) * row_bytes);
      }
    }
  }
}

/* ---- one tile: LANES query rows of one row's KV head ---- */

typedef struct {
  float qt[MAX_DIM][LANES] __attribute__((aligned(32))); /* queries, transposed */
  float acc[LANES][MAX_DIM] __attribute__((aligned(32))); /* sum of p * value, per lane */
  __m256 scores[KEY_BLOCK];
  int32_t visible[LANES]; /* keys lane l may attend to: [0, visible[l]) */
  float *out[LANES];      /* where lane l's row of the output goes; NULL: no query row */
} Tile;

/* scores[i] = the tile's queries . key i, for `n` cached keys from `keys`. Four keys at a time:
 * each query vector loaded is used four times, each key value broadcast once. */
TARGET static void score(const Tile *t, const Attention *a, const void *keys, int64_t n,
                         __m256 *scores) {
  const int64_t dim = a->dim;
  const size_t row_bytes = (size_t)dim * element_bytes(a);
  float converted[4 * MAX_DIM] __attribute__((aligned(32)));
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float *k0 = float_rows(a, (const char *)keys + i * row_bytes, 4, converted);
    const float *k1 = k0 + dim, *k2 = k1 + dim, *k3 = k2 + dim;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t d = 0; d < dim; d++) {
      __m256 q = _mm256_load_ps(t->qt[d]);
      s0 = _mm256_fmadd_ps(q, _mm256_broadcast_ss(k0 + d), s0);
      s1 = _mm256_fmadd_ps(q, _mm256_broadcast_ss(k1 + d), s1);
      s2 = _mm256_fmadd_ps(q, _mm256_broadcast_ss(k2 + d), s2);
      s3 = _mm256_fmadd_ps(q, _mm256_broadcast_ss(k3 + d), s3);
    }
    scores[i] = s0, scores[i + 1] = s1, scores[i + 2] = s2, scores[i + 3] = s3;
  }
  for (; i < n; i++) {
    const float *k0 = float_rows(a, (const char *)keys + i * row_bytes, 1, converted);
    __m256 s0 = _mm256_setzero_ps();
    for (int64_t d = 0; d < dim; d++)
      s0 = _mm256_fmadd_ps(_mm256_load_ps(t->qt[d]), _mm256_broadcast_ss(k0 + d), s0);
    scores[i] = s0;
  }
}

/* 8 dims of a cached value, as floats. */
TARGET static inline __m256 value8(const void *values, int64_t at, const int half) {
  if (half) {
    const uint16_t *halves = values;
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(halves + at)));
  }
  return _mm256_loadu_ps((const float *)values + at);
}

/* acc[l] = acc[l] * rescale[l] + sum_i p[i][l] * value i, 8 dims at a time (8 sums live);
 * `half` constant after inlining, so each cache type gets a loop of its own. */
TARGET static inline __attribute__((always_inline)) void accumulate_values(
    Tile *t, const void *values, int64_t n, int64_t dim, __m256 rescale, const int half) {
  float factor[LANES] __attribute__((aligned(32)));
  _mm256_store_ps(factor, rescale);
  for (int64_t c = 0; c < dim; c += 8) {
    __m256 sum[LANES];
    for (int l = 0; l < LANES; l++)
      sum[l] = _mm256_mul_ps(_mm256_load_ps(t->acc[l] + c), _mm256_set1_ps(factor[l]));
    for (int64_t i = 0; i < n; i++) {
      __m256 value = value8(values, i * dim + c, half);
      const float *p = (const float *)&t->scores[i];
      for (int l = 0; l < LANES; l++)
        sum[l] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + l), value, sum[l]);
    }
    for (int l = 0; l < LANES; l++) _mm256_store_ps(t->acc[l] + c, sum[l]);
  }
}

TARGET static void accumulate(Tile *t, const Attention *a, const void *values, int64_t n,
                              __m256 rescale) {
  if (a->half)
    accumulate_values(t, values, n, a->dim, rescale, 1);
  else
    accumulate_values(t, values, n, a->dim, rescale, 0);
}

/* softmax(queries . keys) . values over `keys` keys, one block of KEY_BLOCK at a time: each
 * block's maximum rescales what was summed so far, so no exponent overflows. Returns the
 * softmax denominators, one lane per query row. */
TARGET static __m256 attend_keys(Tile *t, const Attention *a, const void *keys,
                                 const void *values, int64_t count) {
  const int64_t dim = a->dim;
  const size_t row_bytes = (size_t)dim * element_bytes(a);
  __m256i visible = _mm256_loadu_si256((const __m256i *)t->visible);
  int32_t fewest = t->visible[0];
  for (int l = 1; l < LANES; l++) fewest = t->visible[l] < fewest ? t->visible[l] : fewest;
  const __m256 minus_infinity = _mm256_set1_ps(-INFINITY);
  __m256 top = minus_infinity, total = _mm256_setzero_ps();
  for (int l = 0; l < LANES; l++) memset(t->acc[l], 0, (size_t)dim * sizeof(float));
  for (int64_t first = 0; first < count; first += KEY_BLOCK) {
    int64_t n = count - first < KEY_BLOCK ? count - first : KEY_BLOCK;
    /* The block's values, and the next block's keys, are on their way while it scores. */
    const char *block_values = (const char *)values + first * row_bytes;
    const char *next_keys = (const char *)keys + (first + n) * row_bytes;
    for (size_t line = 0; line < (size_t)n * row_bytes; line += 64)
      _mm_prefetch(block_values + line, _MM_HINT_T0);
    for (size_t line = 0; line < KEY_BLOCK * row_bytes && first + n < count; line += 64)
      _mm_prefetch(next_keys + line, _MM_HINT_T0);
    score(t, a, (const char *)keys + first * row_bytes, n, t->scores);
    __m256 block_top = top;
    for (int64_t i = 0; i < n; i++) {
      if (first + i >= fewest) { /* causal: a later prompt token's key, hidden from some rows */
        __m256i shown = _mm256_cmpgt_epi32(visible, _mm256_set1_epi32((int)(first + i)));
        t->scores[i] = _mm256_blendv_ps(minus_infinity, t->scores[i], _mm256_castsi256_ps(shown));
      }
      block_top = _mm256_max_ps(block_top, t->scores[i]);
    }
    /* e^(old max - new max): 0 on the first block, whose old max is -inf. */
    __m256 rescale = exp8(_mm256_sub_ps(top, block_top));
    rescale = _mm256_and_ps(rescale, _mm256_cmp_ps(top, minus_infinity, _CMP_NEQ_OQ));
    total = _mm256_mul_ps(total, rescale);
    for (int64_t i = 0; i < n; i++) {
      __m256 hidden = _mm256_cmp_ps(t->scores[i], minus_infinity, _CMP_EQ_OQ);
      __m256 p = _mm256_andnot_ps(hidden, exp8(_mm256_sub_ps(t->scores[i], block_top)));
      t->scores[i] = p;
      total = _mm256_add_ps(total, p);
    }
    accumulate(t, a, block_values, n, rescale);
    top = block_top;
  }
  return total;
}

/* Task `index` of the ParallelFor: tile `index % tiles` of row and KV head `index / tiles`.
 * A tile's rows are (token, query head) pairs, token-major, among the heads sharing the KV head. */
TARGET static void attend_tile(void *data, size_t index) {
  const Attention *a = data;
  int64_t tile = (int64_t)index % a->tiles, pair = (int64_t)index / a->tiles;
  int64_t head = pair % a->kv_heads, b = pair / a->kv_heads;
  int64_t group = a->heads / a->kv_heads, dim = a->dim, past = past_length(a, b);
  Tile t;
  float rotated[MAX_DIM];
  memset(t.qt, 0, (size_t)dim * sizeof t.qt[0]);
  int64_t count = 0;
  for (int l = 0; l < LANES; l++) {
    int64_t r = tile * LANES + l, s = r / group;
    t.visible[l] = 1; /* a lane without a query row attends one key, and is not written */
    t.out[l] = NULL;
    if (s >= a->tokens || s < first_token(a, b)) continue;
    int64_t token = b * a->tokens + s, query_head = head * group + r % group;
    rotate(a, a->q + token * a->q_stride + query_head * dim, past + s, a->scale, rotated);
    for (int64_t d = 0; d < dim; d++) t.qt[d][l] = rotated[d];
    t.out[l] = a->out + (token * a->heads + query_head) * dim;
    t.visible[l] = (int32_t)(past + s + 1);
    count = past + s + 1 > count ? past + s + 1 : count;
  }
  __m256 total =
      attend_keys(&t, a, cache_row(a, a->keys, b, head), cache_row(a, a->values, b, head), count);
  float denominator[LANES] __attribute__((aligned(32)));
  _mm256_store_ps(denominator, total);
  for (int l = 0; l < LANES; l++) {
    if (t.out[l] == NULL) continue;
    __m256 inverse = _mm256_set1_ps(1.0f / denominator[l]);
    for (int64_t d = 0; d < dim; d += 8)
      _mm256_storeu_ps(t.out[l] + d, _mm256_mul_ps(_mm256_load_ps(t.acc[l] + d), inverse));
  }
}

/* ---- ONNX Runtime plumbing ---- */

static OrtStatus *invalid(const char *message) {
  return g_api->CreateStatus(ORT_INVALID_ARGUMENT, message);
}

/* Input `index`'s data and shape (rank at most 4); NULL data for an absent optional input. */
static OrtStatus *tensor(OrtKernelContext *context, size_t index, void **data, int64_t *dims,
                         size_t *rank) {
  const OrtValue *value;
  RETURN_IF_ERROR(tokenshop_input(context, index, &value));
  *data = NULL;
  *rank = 0;
  if (value == NULL) return NULL;
  OrtTensorTypeAndShapeInfo *info;
  RETURN_IF_ERROR(g_api->GetTensorTypeAndShape(value, &info));
  OrtStatus *status = g_api->GetDimensionsCount(info, rank);
  if (status == NULL && *rank > 4) status = invalid("CachedAttention: an input of rank > 4");
  if (status == NULL) status = g_api->GetDimensions(info, dims, *rank);
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  if (status != NULL) return status;
  return g_api->GetTensorMutableData((OrtValue *)value, data);
}

static OrtStatus *output(OrtKernelContext *context, size_t index, const int64_t *dims,
                         size_t rank, void **data) {
  OrtValue *value;
  RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, index, dims, rank, &value));
  return g_api->GetTensorMutableData(value, data);
}

/* present = past, row by row, when they are not the same buffer. */
static void copy_past(const Attention *a, const char *past_keys, const char *past_values,
                      int64_t past_capacity) {
  for (int64_t b = 0; b < a->batch; b++) {
    int64_t past = past_length(a, b);
    size_t bytes = (size_t)((past > 0 ? past : 0) * a->dim) * element_bytes(a);
    for (int64_t h = 0; h < a->kv_heads; h++) {
      size_t from = (size_t)((b * a->kv_heads + h) * past_capacity * a->dim) * element_bytes(a);
      memcpy(cache_row(a, a->keys, b, h), past_keys + from, bytes);
      memcpy(cache_row(a, a->values, b, h), past_values + from, bytes);
    }
  }
}

/* The new tokens' q, k, v: packed in input 0, or three inputs. */
static OrtStatus *read_tokens(OrtKernelContext *context, const AttentionKernel *k,
                              Attention *a) {
  void *q, *key, *value;
  int64_t qd[4], kd[4], vd[4];
  size_t qr, kr, vr;
  RETURN_IF_ERROR(tensor(context, 0, &q, qd, &qr));
  RETURN_IF_ERROR(tensor(context, 1, &key, kd, &kr));
  RETURN_IF_ERROR(tensor(context, 2, &value, vd, &vr));
  if (qr != 3) return invalid("CachedAttention: query must be [batch, tokens, hidden]");
  a->batch = qd[0], a->tokens = qd[1];
  int64_t q_width = k->heads * a->dim, kv_width = k->kv_heads * a->dim;
  a->q = q;
  if (key == NULL && value == NULL) {
    if (qd[2] != q_width + 2 * kv_width)
      return invalid("CachedAttention: packed query is not (num_heads + 2 kv_num_heads) x dim");
    a->k = a->q + q_width, a->v = a->k + kv_width, a->q_stride = a->kv_stride = qd[2];
    return NULL;
  }
  int shapes_ok = key != NULL && value != NULL && kr == 3 && vr == 3 && qd[2] == q_width;
  for (int i = 0; shapes_ok && i < 2; i++) shapes_ok = kd[i] == qd[i] && vd[i] == qd[i];
  if (!shapes_ok || kd[2] != kv_width || vd[2] != kv_width)
    return invalid("CachedAttention: query, key, value shapes do not match the heads");
  a->k = key, a->v = value, a->q_stride = q_width, a->kv_stride = kv_width;
  return NULL;
}

static OrtStatus *compute_checked(const AttentionKernel *k, OrtKernelContext *context) {
  Attention a = {.heads = k->heads, .kv_heads = k->kv_heads, .half = k->half_cache};
  void *past_keys, *past_values, *seqlens, *total, *cos, *sin;
  int64_t pk[4], pv[4], sd[4], td[4], cd[4], nd[4];
  size_t pkr, pvr, sr, tr, cr, nr;
  RETURN_IF_ERROR(tensor(context, 3, &past_keys, pk, &pkr));
  RETURN_IF_ERROR(tensor(context, 4, &past_values, pv, &pvr));
  if (past_keys == NULL || past_values == NULL || pkr != 4 || pvr != 4 ||
      memcmp(pk, pv, sizeof pk) != 0 || pk[1] != k->kv_heads || pk[3] % 8 || pk[3] > MAX_DIM)
    return invalid("CachedAttention: past key/value must be [batch, kv_num_heads, capacity, "
                   "dim], dim a multiple of 8 up to 256");
  a.dim = pk[3];
  RETURN_IF_ERROR(read_tokens(context, k, &a));
  RETURN_IF_ERROR(tensor(context, 5, &seqlens, sd, &sr));
  RETURN_IF_ERROR(tensor(context, 6, &total, td, &tr));
  RETURN_IF_ERROR(tensor(context, 7, &cos, cd, &cr));
  RETURN_IF_ERROR(tensor(context, 8, &sin, nd, &nr));
  if (pk[0] != a.batch || seqlens == NULL || sr != 1 || sd[0] != a.batch || total == NULL)
    return invalid("CachedAttention: past and seqlens_k must have the query's batch");
  a.seqlens = seqlens;
  int64_t longest = *(const int32_t *)total;
  for (int64_t b = 0; b < a.batch; b++)
    if (a.seqlens[b] < 0 || past_length(&a, b) > pk[2] || a.seqlens[b] + 1 > longest)
      return invalid("CachedAttention: seqlens_k does not fit the past and the new tokens");
  if ((cos == NULL) != (sin == NULL) ||
      (cos != NULL && (cr != 2 || nr != 2 || cd[1] != a.dim / 2 || nd[1] != a.dim / 2 ||
                       nd[0] != cd[0] || longest > cd[0] || a.dim % 2)))
    return invalid("CachedAttention: cos/sin caches must be [positions, dim / 2], long enough");
  a.cos = cos, a.sin = sin;

  int64_t dims[4] = {a.batch, a.tokens, a.heads * a.dim, 0};
  RETURN_IF_ERROR(output(context, 0, dims, 3, (void **)&a.out));
  int64_t present[4] = {a.batch, a.kv_heads, pk[2] > longest ? pk[2] : longest, a.dim};
  RETURN_IF_ERROR(output(context, 1, present, 4, &a.keys));
  RETURN_IF_ERROR(output(context, 2, present, 4, &a.values));
  a.capacity = present[2];
  a.scale = k->scale != 0.0f ? k->scale : 1.0f / sqrtf((float)a.dim);
  if (a.batch == 0 || a.tokens == 0) return NULL;
  if (a.keys != past_keys || a.values != past_values) copy_past(&a, past_keys, past_values, pk[2]);
  append(&a);
  for (int64_t b = 0; b < a.batch; b++) /* padding's output: zeros, not what memory held */
    memset(a.out + b * a.tokens * a.heads * a.dim, 0,
           (size_t)(first_token(&a, b) * a.heads * a.dim) * sizeof(float));
  int64_t group = a.heads / a.kv_heads;
  a.tiles = (a.tokens * group + LANES - 1) / LANES;
  size_t tasks = (size_t)(a.batch * a.kv_heads * a.tiles);
  return g_api->KernelContext_ParallelFor(context, attend_tile, tasks, 0, &a);
}

static OrtStatus *ORT_API_CALL compute(void *kernel, OrtKernelContext *context) {
  return compute_checked(kernel, context);
}

static OrtStatus *ORT_API_CALL create_kernel(const OrtCustomOp *op, const OrtApi *api,
                                             const OrtKernelInfo *info, void **kernel) {
  (void)api;
  AttentionKernel k = {.half_cache = ((const AttentionOp *)op)->half_cache};
  RETURN_IF_ERROR(g_api->KernelInfoGetAttribute_int64(info, "num_heads", &k.heads));
  RETURN_IF_ERROR(g_api->KernelInfoGetAttribute_int64(info, "kv_num_heads", &k.kv_heads));
  OrtStatus *missing = g_api->KernelInfoGetAttribute_float(info, "scale", &k.scale);
  if (missing != NULL) g_api->ReleaseStatus(missing); /* optional: 1 / sqrt(D) */
  if (k.heads <= 0 || k.kv_heads <= 0 || k.heads % k.kv_heads != 0)
    return invalid("CachedAttention: num_heads must be a multiple of kv_num_heads");
  AttentionKernel *made = malloc(sizeof(AttentionKernel));
  if (made == NULL) return g_api->CreateStatus(ORT_FAIL, "CachedAttention: out of memory");
  *made = k;
  *kernel = made;
  return NULL;
}

static void ORT_API_CALL destroy_kernel(void *kernel) { free(kernel); }

static int half_cache(const OrtCustomOp *op) { return ((const AttentionOp *)op)->half_cache; }

static const char *ORT_API_CALL op_name(const OrtCustomOp *op) {
  return half_cache(op) ? "CachedAttentionHalfCache" : "CachedAttention";
}

static ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp *op, size_t index) {
  if (index == 5 || index == 6) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
  if ((index == 3 || index == 4) && half_cache(op)) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}

/* The output, then the present keys and values: float16 in the half cache's op. */
static ONNXTensorElementDataType ORT_API_CALL output_type(const OrtCustomOp *op, size_t index) {
  return index > 0 && half_cache(op) ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16
                                     : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}

static size_t ORT_API_CALL input_count(const OrtCustomOp *op) {
  (void)op;
  return 9;
}

static size_t ORT_API_CALL output_count(const OrtCustomOp *op) {
  (void)op;
  return 3;
}

static OrtCustomOpInputOutputCharacteristic ORT_API_CALL input_characteristic(
    const OrtCustomOp *op, size_t index) {
  (void)op;
  int optional = index == 1 || index == 2 || index == 7 || index == 8;
  return optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}

void tokenshop_fill_attention(AttentionOp *attention, int half_cache) {
  static const OpCallbacks callbacks = {
      .name = op_name,
      .input_type = input_type,
      .output_type = output_type,
      .input_count = input_count,
      .output_count = output_count,
      .input_characteristic = input_characteristic,
      .create = create_kernel,
      .compute = compute,
      .destroy = destroy_kernel,
  };
  attention->half_cache = half_cache;
  tokenshop_fill_op(&attention->op, &callbacks);
}
