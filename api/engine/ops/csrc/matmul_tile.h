/* The product of matmul.c for one instruction set. matmul.c includes this file once
 * per set, having defined:
 *   TILE_TARGET   the functions' target attribute
 *   TILE(name)    the name with the set's suffix
 *   TILE_VNNI     1: vpdpbusd (AVX-512 VNNI); 0: vpmaddubsw + vpmaddwd (AVX2)
 *   TILE_ROWS     rows of a tile, and TILE_PANELS its 8-column panels (what the registers hold:
 *                 a tile keeps 2 * TILE_ROWS * TILE_PANELS vectors live)
 *   TILE_PANELS_ONE_ROW  panels of a one-row tile (one decoding sequence: more independent sums)
 *
 * A tile's lanes are columns: each vector holds 8 columns' running sums for one row, so a row's
 * 4 activations are broadcast to all lanes and the 32 bytes of a panel's group hold 4 weights of
 * each of its 8 columns. Scales are applied once per (row, block, panel): a convert and two FMAs
 * for 8 x block products.
 */

#define TILE_INLINE __attribute__((target(TILE_TARGET), always_inline)) static inline

#if TILE_VNNI
/* dot's lanes (one per column) += the products of 8 unsigned weights per column (`lo`: the even
 * ones, `hi`: the odd ones) with the row's 8 activations at `a` (4 even, then 4 odd). AVX2's
 * int4 tiles multiply in TILE(tile_int16). */
TILE_INLINE __m256i TILE(dot8)(__m256i dot, __m256i lo, __m256i hi, const int8_t *a) {
  int32_t even, odd;
  memcpy(&even, a, 4);
  memcpy(&odd, a + 4, 4);
  dot = _mm256_dpbusd_epi32(dot, lo, _mm256_set1_epi32(even));
  return _mm256_dpbusd_epi32(dot, hi, _mm256_set1_epi32(odd));
}
#endif

/* The same for int8 weights as they are. VNNI: flipped to unsigned (w + 128; the correction
 * takes 128 x the activations off). AVX2: |w| times the activation with w's sign (llama.cpp's
 * way), whose pairs, at most 2 x 128 x 127, fit an int16 only one product pair at a time. */
TILE_INLINE __m256i TILE(dot8_int8)(__m256i dot, __m256i lo, __m256i hi, const int8_t *a) {
#if TILE_VNNI
  const __m256i flip = _mm256_set1_epi8((char)0x80);
  return TILE(dot8)(dot, _mm256_xor_si256(lo, flip), _mm256_xor_si256(hi, flip), a);
#else
  int32_t even, odd;
  memcpy(&even, a, 4);
  memcpy(&odd, a + 4, 4);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i lo_pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(lo),
                                          _mm256_sign_epi8(_mm256_set1_epi32(even), lo));
  __m256i hi_pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(hi),
                                          _mm256_sign_epi8(_mm256_set1_epi32(odd), hi));
  dot = _mm256_add_epi32(dot, _mm256_madd_epi16(lo_pairs, ones));
  return _mm256_add_epi32(dot, _mm256_madd_epi16(hi_pairs, ones));
#endif
}

/* silu(gate) * up = gate / (1 + e^-gate) * up: a SwiGLU MLP's activation, for 8 columns. */
TILE_INLINE __m256 TILE(swiglu8)(__m256 gate, __m256 up) {
  __m256 minus_gate = _mm256_sub_ps(_mm256_setzero_ps(), gate);
  __m256 denominator = _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(minus_gate));
  return _mm256_mul_ps(_mm256_div_ps(gate, denominator), up);
}

/* Where rows from `row` and panels from `panel` write Y: with `swiglu` a pair of panels (gate,
 * up) makes 8 columns. */
TILE_INLINE float *TILE(out_at)(const MatMulTask *t, int64_t row, int64_t panel) {
  return t->y + row * t->y_stride + (t->swiglu ? panel / 2 : panel) * 8;
}

/* The residual's values for the Y values at `y` (the residual is laid out as Y; no swiglu). */
TILE_INLINE const float *TILE(residual_at)(const MatMulTask *t, const float *y) {
  return t->residual != NULL ? t->residual + (y - t->y) : NULL;
}

/* Y for a tile of `rows` x `panels` sums (row m's at acc[m * stride]): SwiGLU, bias, residual. */
TILE_INLINE void TILE(store)(const MatMulTask *t, const int rows, const int panels,
                             const __m256 *acc, const int stride, const float *bias, float *y) {
  if (t->swiglu) { /* panels come in (gate, up) pairs; a tile never splits one */
    for (int c = 0; c + 1 < panels; c += 2)
      for (int m = 0; m < rows; m++)
        _mm256_storeu_ps(y + m * t->y_stride + 4 * c,
                         TILE(swiglu8)(acc[m * stride + c], acc[m * stride + c + 1]));
    return;
  }
  const float *residual = TILE(residual_at)(t, y);
  for (int c = 0; c < panels; c++) {
    const __m256 add = bias != NULL ? _mm256_loadu_ps(bias + 8 * c) : _mm256_setzero_ps();
    for (int m = 0; m < rows; m++) {
      __m256 out = _mm256_add_ps(acc[m * stride + c], add);
      if (residual != NULL)
        out = _mm256_add_ps(out, _mm256_loadu_ps(residual + m * t->y_stride + 8 * c));
      _mm256_storeu_ps(y + m * t->y_stride + 8 * c, out);
    }
  }
}

/* A block's integer sums into a tile's float sums (row m's at [m * stride]): acc += sb * (sa *
 * dot - sa * zero point * sum(qa)), the zero point's share taken off per block. `bscale` is the
 * block's first scales of the tile's first panel. */
TILE_INLINE void TILE(add_block)(const MatMulTask *t, const int rows, const int panels,
                                 const __m256i *dot, __m256 *acc, const int stride,
                                 const float *sa, const float *corrections,
                                 const float *bscale) {
  for (int c = 0; c < panels; c++) {
    const __m256 sb = _mm256_loadu_ps(bscale + c * t->panel_scales);
    for (int m = 0; m < rows; m++) {
      __m256 v = _mm256_fmsub_ps(_mm256_cvtepi32_ps(dot[m * stride + c]),
                                 _mm256_broadcast_ss(sa + m), _mm256_broadcast_ss(corrections + m));
      acc[m * stride + c] = _mm256_fmadd_ps(v, sb, acc[m * stride + c]);
    }
  }
}

#if TILE_VNNI
/* Y for a tile of `rows` x `pairs` sums (row m's at acc[m * stride]): SwiGLU, bias, residual. */
TILE_INLINE void TILE(store_pairs)(const MatMulTask *t, const int rows, const int pairs,
                                   const __m512 *acc, const int stride, const float *bias,
                                   float *y) {
  const float *residual = TILE(residual_at)(t, y);
  for (int c = 0; c < pairs; c++)
    for (int m = 0; m < rows; m++) {
      __m512 sum = acc[m * stride + c];
      __m256 first = _mm512_castps512_ps256(sum);
      __m256 second = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sum), 1));
      if (t->swiglu) { /* a pair is one (gate, up) pair of panels: 8 columns of Y */
        _mm256_storeu_ps(y + m * t->y_stride + 8 * c, TILE(swiglu8)(first, second));
        continue;
      }
      if (bias != NULL) sum = _mm512_add_ps(sum, _mm512_loadu_ps(bias + 16 * c));
      if (residual != NULL)
        sum = _mm512_add_ps(sum, _mm512_loadu_ps(residual + m * t->y_stride + 16 * c));
      _mm512_storeu_ps(y + m * t->y_stride + 16 * c, sum);
    }
}

/* A group's 32 bytes from each of two panels as one vector, panel `a`'s in the low half. */
TILE_INLINE __m512i TILE(pair_of)(const uint8_t *a, const uint8_t *b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                            _mm256_loadu_si256((const __m256i *)b), 1);
}

TILE_INLINE __m512 TILE(pair_of_floats)(const float *a, const float *b) {
  __m512d low = _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(a)));
  return _mm512_castpd_ps(_mm512_insertf64x4(low, _mm256_castps_pd(_mm256_loadu_ps(b)), 1));
}

/* A group's weights of the two panels from `group` (the first's; the second `panel` bytes on)
 * as the two vectors vpdpbusd multiplies, unsigned: `lo` the even-indexed, `hi` the odd ones;
 * int4 as stored (zero point 8), int8 flipped (zero point 128, as TILE(dot8_int8)). */
TILE_INLINE void TILE(unpack_pair)(const uint8_t *group, int64_t panel, const int bits,
                                   __m512i *lo, __m512i *hi) {
  if (bits == 4) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512i packed = TILE(pair_of)(group, group + panel);
    *lo = _mm512_and_si512(packed, low);
    *hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
  } else {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    *lo = _mm512_xor_si512(TILE(pair_of)(group, group + panel), flip);
    *hi = _mm512_xor_si512(TILE(pair_of)(group + 32, group + panel + 32), flip);
  }
}

/* sums += w times the 4 activations at `a` broadcast to every lane, the broadcast folded into
 * the multiply's memory operand ({1to16}); from intrinsics GCC loads each broadcast into a
 * register of its own first. Figures: bench/results/2026-11-26-kernel-notes.md. */
TILE_INLINE __m512i TILE(dpbusd_bcast)(__m512i sums, __m512i w, const int8_t *a) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(sums) : "v"(w), "m"(*(const int32_t *)a));
  return sums;
}

/* TILE(tile_pairs) for its hottest case, 8 rows of two pairs of panels (the rows of a prefill,
 * and 8 decoding streams), written out row by row so that GCC keeps the 16 sums in registers:
 * with the general tile's arrays it shuffled them between registers and the stack. Figures:
 * bench/results/2026-11-26-kernel-notes.md. */
TILE_INLINE void TILE(tile8)(const MatMulTask *t, int64_t row0, const int groups, const int bits,
                             const uint8_t *b, const float *bscale, const float *bias,
                             float *y) {
  const QuantizedRows *r = t->rows;
  const int64_t block = r->block, panel = t->panel_bytes;
  const int8_t *qa = r->q + row0 * block;
  const float *sa = r->scales + row0, *corrections = r->corrections + row0;
  __m512 acc[16];
  for (int m = 0; m < 16; m++) acc[m] = _mm512_setzero_ps();
  for (int64_t blk = 0; blk < r->blocks; blk++) {
    __m512i p0 = _mm512_setzero_si512(), p1 = p0, p2 = p0, p3 = p0, p4 = p0, p5 = p0, p6 = p0,
            p7 = p0, q0 = p0, q1 = p0, q2 = p0, q3 = p0, q4 = p0, q5 = p0, q6 = p0, q7 = p0;
    const uint8_t *bb = b + blk * block * bits;
    for (int g = 0; g < groups; g += 2) { /* groups is even: two a turn, no branch */
      for (int c = 0; c < 4; c++) /* the next tile's panels, as TILE(tile) explains */
        for (int line = 0; line < bits / 4; line++)
          _mm_prefetch((const char *)(bb + (4 + c) * panel + 8 * bits * g + 64 * line),
                       _MM_HINT_T1);
#define TILE8_ROW(m, a)                                                     \
  {                                                                         \
    const int8_t *even = (a) + (m) * block, *odd = even + 4;                \
    p##m = TILE(dpbusd_bcast)(TILE(dpbusd_bcast)(p##m, lo0, even), hi0, odd); \
    q##m = TILE(dpbusd_bcast)(TILE(dpbusd_bcast)(q##m, lo1, even), hi1, odd); \
  }
#define TILE8_GROUP(g)                                                                  \
  {                                                                                     \
    const uint8_t *w = bb + 8 * bits * (g);                                             \
    __m512i lo0, hi0, lo1, hi1;                                                         \
    if (bits == 4) { /* both loads first: through TILE(unpack_pair) it was slower       \
                        (kernel notes) */                                               \
      const __m512i low = _mm512_set1_epi8(0x0F);                                       \
      __m512i packed0 = TILE(pair_of)(w, w + panel);                                    \
      __m512i packed1 = TILE(pair_of)(w + 2 * panel, w + 3 * panel);                    \
      lo0 = _mm512_and_si512(packed0, low);                                             \
      hi0 = _mm512_and_si512(_mm512_srli_epi16(packed0, 4), low);                       \
      lo1 = _mm512_and_si512(packed1, low);                                             \
      hi1 = _mm512_and_si512(_mm512_srli_epi16(packed1, 4), low);                       \
    } else {                                                                            \
      TILE(unpack_pair)(w, panel, bits, &lo0, &hi0);                                    \
      TILE(unpack_pair)(w + 2 * panel, panel, bits, &lo1, &hi1);                        \
    }                                                                                   \
    const int8_t *a = qa + 8 * (g);                                                     \
    TILE8_ROW(0, a) TILE8_ROW(1, a) TILE8_ROW(2, a) TILE8_ROW(3, a)                  \
    TILE8_ROW(4, a) TILE8_ROW(5, a) TILE8_ROW(6, a) TILE8_ROW(7, a)                  \
  }
      TILE8_GROUP(g)
      TILE8_GROUP(g + 1)
#undef TILE8_GROUP
#undef TILE8_ROW
    }
    const float *first = bscale + blk * 8;
    const __m512 sb0 = TILE(pair_of_floats)(first, first + t->panel_scales);
    const __m512 sb1 = TILE(pair_of_floats)(first + 2 * t->panel_scales, first + 3 * t->panel_scales);
#define TILE8_SCALE(m)                                                                        \
  {                                                                                           \
    __m512 sa_m = _mm512_set1_ps(sa[m]), correction = _mm512_set1_ps(corrections[m]);        \
    acc[2 * (m)] = _mm512_fmadd_ps(_mm512_fmsub_ps(_mm512_cvtepi32_ps(p##m), sa_m, correction), \
                                   sb0, acc[2 * (m)]);                                        \
    acc[2 * (m) + 1] = _mm512_fmadd_ps(                                                       \
        _mm512_fmsub_ps(_mm512_cvtepi32_ps(q##m), sa_m, correction), sb1, acc[2 * (m) + 1]);  \
  }
    TILE8_SCALE(0) TILE8_SCALE(1) TILE8_SCALE(2) TILE8_SCALE(3)
    TILE8_SCALE(4) TILE8_SCALE(5) TILE8_SCALE(6) TILE8_SCALE(7)
#undef TILE8_SCALE
    qa += r->rows * block;
    sa += r->rows;
    corrections += r->rows;
  }
  TILE(store_pairs)(t, 8, 2, acc, 2, bias, y);
}

/* TILE(tile) for an even number of panels, two panels (16 columns) to a 512-bit vector. An
 * AVX-512 Xeon (with AMX) ran vpdpbusd on 512-bit vectors at nearly the rate of 256-bit ones
 * (7.07 against 8.1 G instructions/s per core, 10 independent sums), so each instruction does
 * 1.75x the multiplies. The weights keep their 8-column panels: each vector is loaded from two
 * of them. */
TILE_INLINE void TILE(tile_pairs)(const MatMulTask *t, int64_t row0, const int rows,
                                  const int pairs, const int groups, const int bits,
                                  const uint8_t *b, const float *bscale, const float *bias,
                                  float *y) {
  if (rows == 8 && pairs == 2) {
    TILE(tile8)(t, row0, groups, bits, b, bscale, bias, y);
    return;
  }
  const QuantizedRows *r = t->rows;
  const int64_t block = r->block, panel = t->panel_bytes;
  const int8_t *qa = r->q + row0 * block;
  const float *sa = r->scales + row0, *corrections = r->corrections + row0;
  __m512 acc[TILE_ROWS][TILE_PANELS_MAX / 2];
  for (int m = 0; m < rows; m++)
    for (int c = 0; c < pairs; c++) acc[m][c] = _mm512_setzero_ps();
  for (int64_t blk = 0; blk < r->blocks; blk++) {
    __m512i dot[TILE_ROWS][TILE_PANELS_MAX / 2];
    for (int m = 0; m < rows; m++)
      for (int c = 0; c < pairs; c++) dot[m][c] = _mm512_setzero_si512();
    const uint8_t *bb = b + blk * block * bits;
    for (int g = 0; g < groups; g++) {
      if (bits == 8 || (g & 1) == 0) /* the next tile's panels, as TILE(tile) explains */
        for (int c = 0; c < 2 * pairs; c++)
          _mm_prefetch((const char *)(bb + (c + 2 * pairs) * panel + 8 * bits * g), _MM_HINT_T1);
      for (int c = 0; c < pairs; c++) {
        const uint8_t *group = bb + 2 * c * panel + 8 * bits * g;
        __m512i lo, hi;
        TILE(unpack_pair)(group, panel, bits, &lo, &hi);
        for (int m = 0; m < rows; m++) {
          int32_t even, odd;
          memcpy(&even, qa + m * block + 8 * g, 4);
          memcpy(&odd, qa + m * block + 8 * g + 4, 4);
          dot[m][c] = _mm512_dpbusd_epi32(dot[m][c], lo, _mm512_set1_epi32(even));
          dot[m][c] = _mm512_dpbusd_epi32(dot[m][c], hi, _mm512_set1_epi32(odd));
        }
      }
    }
    for (int c = 0; c < pairs; c++) {
      const float *first = bscale + 2 * c * t->panel_scales + blk * 8;
      const __m512 sb = TILE(pair_of_floats)(first, first + t->panel_scales);
      for (int m = 0; m < rows; m++) {
        __m512 v = _mm512_fmsub_ps(_mm512_cvtepi32_ps(dot[m][c]), _mm512_set1_ps(sa[m]),
                                   _mm512_set1_ps(corrections[m]));
        acc[m][c] = _mm512_fmadd_ps(v, sb, acc[m][c]);
      }
    }
    qa += r->rows * block;
    sa += r->rows;
    corrections += r->rows;
  }
  TILE(store_pairs)(t, rows, pairs, &acc[0][0], TILE_PANELS_MAX / 2, bias, y);
}
#endif

#if !TILE_VNNI
/* TILE(tile) for AVX2's int4 tiles (up to 4 rows, up to 8 rows x panels), with int16 sums: a
 * group adds at most 2 x 2 x 15 x 127 = 7620 to a lane, so 4 groups fit an int16 and are widened
 * (`vpmaddwd`) once, not each: 4 rows x 2 panels take 18 multiplies per group instead of 24, on
 * the two pipes that run them. Its 8 int16 sums, the group's 4 weight vectors and one row's 2
 * broadcasts fill the 16 registers (1 x 4: 4 sums, 8 vectors); the int32 sums, touched once
 * every 4 groups, live on the stack. The empty asm pins the sums in their registers: without it
 * GCC reassociated 4 groups' adds into a tree, computed all 32 products first and spilled them.
 * Its groups are unrolled (slower otherwise). Figures:
 * bench/results/2026-11-26-kernel-notes.md. */
TILE_INLINE void TILE(tile_int16)(const MatMulTask *t, int64_t row0, const int rows,
                                  const int panels, const int groups, const uint8_t *b,
                                  const float *bscale, const float *bias, float *y) {
  const QuantizedRows *r = t->rows;
  const int64_t block = r->block, panel = t->panel_bytes;
  const int8_t *qa = r->q + row0 * block;
  const float *sa = r->scales + row0, *corrections = r->corrections + row0;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 acc[4][4];
  for (int m = 0; m < rows; m++)
    for (int c = 0; c < panels; c++) acc[m][c] = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < r->blocks; blk++) {
    __m256i dot[4][4];
    for (int m = 0; m < rows; m++)
      for (int c = 0; c < panels; c++) dot[m][c] = _mm256_setzero_si256();
    const uint8_t *bb = b + blk * block * 4;
    for (int g0 = 0; g0 < groups; g0 += 4) {
      __m256i s16[4][4];
      for (int m = 0; m < rows; m++)
        for (int c = 0; c < panels; c++) s16[m][c] = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int g = g0; g < g0 + 4; g++) {
        if ((g & 1) == 0) /* the next tile's panels, as TILE(tile) explains */
          for (int c = 0; c < panels; c++)
            _mm_prefetch((const char *)(bb + (c + panels) * panel + 32 * g), _MM_HINT_T1);
        __m256i lo[4], hi[4];
        for (int c = 0; c < panels; c++) {
          const __m256i packed = _mm256_loadu_si256((const __m256i *)(bb + c * panel + 32 * g));
          lo[c] = _mm256_and_si256(packed, low);
          hi[c] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
        }
        for (int m = 0; m < rows; m++) {
          int32_t even, odd;
          memcpy(&even, qa + m * block + 8 * g, 4);
          memcpy(&odd, qa + m * block + 8 * g + 4, 4);
          const __m256i e = _mm256_set1_epi32(even), o = _mm256_set1_epi32(odd);
          for (int c = 0; c < panels; c++) {
            s16[m][c] = _mm256_add_epi16(s16[m][c], _mm256_maddubs_epi16(lo[c], e));
            s16[m][c] = _mm256_add_epi16(s16[m][c], _mm256_maddubs_epi16(hi[c], o));
            __asm__("" : "+x"(s16[m][c]));
          }
        }
      }
      for (int m = 0; m < rows; m++)
        for (int c = 0; c < panels; c++)
          dot[m][c] = _mm256_add_epi32(dot[m][c], _mm256_madd_epi16(s16[m][c], ones));
    }
    TILE(add_block)(t, rows, panels, &dot[0][0], &acc[0][0], 4, sa, corrections, bscale + blk * 8);
    qa += r->rows * block;
    sa += r->rows;
    corrections += r->rows;
  }
  TILE(store)(t, rows, panels, &acc[0][0], 4, bias, y);
}
#endif

/* y[rows][panels * 8] = rows row0.. of the activations times `panels` panels from `b` (the
 * first panel's weights, of `bits` 4 or 8; `bscale` its scales). Inlined with constant `rows`,
 * `panels`, `groups` (weights per block / 8) and `bits`, so that the loops unroll and the sums
 * live in registers. */
TILE_INLINE void TILE(tile)(const MatMulTask *t, int64_t row0, const int rows, const int panels,
                            const int groups, const int bits, const uint8_t *b,
                            const float *bscale, const float *bias, float *y) {
#if TILE_VNNI
  if (panels % 2 == 0) {
    TILE(tile_pairs)(t, row0, rows, panels / 2, groups, bits, b, bscale, bias, y);
    return;
  }
#else
  _Static_assert(TILE_ROWS <= 4 && TILE_ROWS * TILE_PANELS <= 8 && TILE_PANELS_ONE_ROW <= 8,
                 "TILE(tile_int16) holds every AVX2 int4 tile");
  if (bits == 4) {
    TILE(tile_int16)(t, row0, rows, panels, groups, b, bscale, bias, y);
    return;
  }
#endif
  const QuantizedRows *r = t->rows;
  const int64_t block = r->block;
  const int8_t *qa = r->q + row0 * block;
  const float *sa = r->scales + row0, *corrections = r->corrections + row0;
  __m256 acc[TILE_ROWS][TILE_PANELS_MAX];
  for (int m = 0; m < rows; m++)
    for (int c = 0; c < panels; c++) acc[m][c] = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < r->blocks; blk++) {
    __m256i dot[TILE_ROWS][TILE_PANELS_MAX];
    for (int m = 0; m < rows; m++)
      for (int c = 0; c < panels; c++) dot[m][c] = _mm256_setzero_si256();
    const uint8_t *bb = b + blk * block * bits;  /* a group: 8 weights x 8 columns x bits / 8 */
    for (int g = 0; g < groups; g++) {
      /* Ask for the next tile's panels (same offset, a tile further on) into L2 while these
       * multiply, a line at a time, so that a tile's loads from memory and its multiplies
       * overlap instead of taking turns. Figures: bench/results/2026-11-26-kernel-notes.md. */
      if (bits == 8 || (g & 1) == 0)  /* a line of 64 bytes at a time */
        for (int c = 0; c < panels; c++)
          _mm_prefetch((const char *)(bb + (c + panels) * t->panel_bytes + 8 * bits * g),
                       _MM_HINT_T1);
      for (int c = 0; c < panels; c++) {
        const uint8_t *group = bb + c * t->panel_bytes + 8 * bits * g;
#if TILE_VNNI
        if (bits == 4) {
          const __m256i low = _mm256_set1_epi8(0x0F);
          __m256i packed = _mm256_loadu_si256((const __m256i *)group);
          __m256i lo = _mm256_and_si256(packed, low);
          __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
          for (int m = 0; m < rows; m++)
            dot[m][c] = TILE(dot8)(dot[m][c], lo, hi, qa + m * block + 8 * g);
          continue;
        }
#endif
        __m256i lo = _mm256_loadu_si256((const __m256i *)group);
        __m256i hi = _mm256_loadu_si256((const __m256i *)(group + 32));
        for (int m = 0; m < rows; m++)
          dot[m][c] = TILE(dot8_int8)(dot[m][c], lo, hi, qa + m * block + 8 * g);
      }
    }
    TILE(add_block)(t, rows, panels, &dot[0][0], &acc[0][0], TILE_PANELS_MAX, sa, corrections,
                    bscale + blk * 8);
    qa += r->rows * block;
    sa += r->rows;
    corrections += r->rows;
  }
  TILE(store)(t, rows, panels, &acc[0][0], TILE_PANELS_MAX, bias, y);
}

/* Rows [row0, row0 + rows) against `panels` panels from panel p, in tiles of TILE_ROWS. */
TILE_INLINE void TILE(rows_of)(const MatMulTask *t, int64_t row0, int64_t rows, int64_t p,
                               const int panels, const int groups, const int bits) {
  const uint8_t *b = t->b + p * t->panel_bytes;
  const float *bscale = t->scales + p * t->panel_scales;
  const float *bias = t->bias != NULL ? t->bias + p * 8 : NULL;
  float *y = TILE(out_at)(t, row0, p);
  int64_t m = 0;
  for (; m + TILE_ROWS <= rows; m += TILE_ROWS)
    TILE(tile)(t, row0 + m, TILE_ROWS, panels, groups, bits, b, bscale, bias, y + m * t->y_stride);
  float *rest = y + m * t->y_stride;
  switch (rows - m) {
#if TILE_ROWS > 7
    case 7: TILE(tile)(t, row0 + m, 7, panels, groups, bits, b, bscale, bias, rest); break;
    case 6: TILE(tile)(t, row0 + m, 6, panels, groups, bits, b, bscale, bias, rest); break;
    case 5: TILE(tile)(t, row0 + m, 5, panels, groups, bits, b, bscale, bias, rest); break;
    case 4: TILE(tile)(t, row0 + m, 4, panels, groups, bits, b, bscale, bias, rest); break;
#endif
#if TILE_ROWS > 3
    case 3: TILE(tile)(t, row0 + m, 3, panels, groups, bits, b, bscale, bias, rest); break;
#endif
#if TILE_ROWS > 2
    case 2: TILE(tile)(t, row0 + m, 2, panels, groups, bits, b, bscale, bias, rest); break;
#endif
    case 1: TILE(tile)(t, row0 + m, 1, panels, groups, bits, b, bscale, bias, rest); break;
    default: break;
  }
}

/* A strip's panels for every row; `groups` and `bits` constant after inlining. */
TILE_INLINE void TILE(strip_of)(const MatMulTask *t, int64_t first, int64_t last,
                                const int groups, const int bits) {
  const int64_t all_rows = t->rows->rows;
  for (int64_t row0 = 0; row0 < all_rows; row0 += ROW_PANEL) {
    int64_t rows = all_rows - row0 < ROW_PANEL ? all_rows - row0 : ROW_PANEL;
    int64_t p = first;
    if (rows == 1)
      for (; p + TILE_PANELS_ONE_ROW <= last; p += TILE_PANELS_ONE_ROW)
        TILE(tile)(t, row0, 1, TILE_PANELS_ONE_ROW, groups, bits, t->b + p * t->panel_bytes,
                   t->scales + p * t->panel_scales, t->bias != NULL ? t->bias + p * 8 : NULL,
                   TILE(out_at)(t, row0, p));
    for (; p + TILE_PANELS <= last; p += TILE_PANELS)
      TILE(rows_of)(t, row0, rows, p, TILE_PANELS, groups, bits);
    for (; p < last; p++) TILE(rows_of)(t, row0, rows, p, 1, groups, bits);
  }
}

/* One parallel task: strip `strip` of 4-bit (or 8-bit) weights. */
TILE_INLINE void TILE(multiply_strip)(void *data, size_t strip, const int bits) {
  const MatMulTask *t = data;
  int64_t first = (int64_t)strip * STRIP_PANELS;
  int64_t last = first + STRIP_PANELS < t->n / 8 ? first + STRIP_PANELS : t->n / 8;
  switch (t->rows->block / 8) {
    case 8: TILE(strip_of)(t, first, last, 8, bits); break;
    case 16: TILE(strip_of)(t, first, last, 16, bits); break;
    case 32: TILE(strip_of)(t, first, last, 32, bits); break;
    default: break; /* refused when the kernel is created */
  }
}

__attribute__((target(TILE_TARGET))) static void TILE(multiply_strip4)(void *data, size_t strip) {
  TILE(multiply_strip)(data, strip, 4);
}

__attribute__((target(TILE_TARGET))) static void TILE(multiply_strip8)(void *data, size_t strip) {
  TILE(multiply_strip)(data, strip, 8);
}

#undef TILE_INLINE
