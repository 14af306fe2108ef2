/* The product of matmul.c on AMX (Intel's tile unit: 8 registers of up to 16 rows x 64
 * bytes, one instruction multiplying two of them into a third). Included once, after the VNNI
 * copy of matmul_tile.h, whose helpers it uses (pair_of, store_pairs) and to which it hands what
 * it does not cover: strips of fewer than 4 panels and batches of fewer than AMX_MIN_ROWS rows.
 *
 * Why: at 8 rows the VNNI kernel issues 8 vpdpbusd per 64 weight bytes and runs well below their
 * peak. A tile instruction does up to 16 x 16 x 64 multiply-adds: the weights are unpacked once
 * into a tile's layout (stored, where VNNI keeps them in registers), and a chunk of 64 weights x
 * 32 columns costs 3 tile loads and 2 multiplies for up to 16 rows. Figures:
 * bench/results/2026-11-26-kernel-notes.md.
 *
 * Layout: the tiles' K order is the activations' (each group of 8 as 4 even-indexed, then 4
 * odd), so the activation tile loads straight from QuantizedRows (stride: the block). A weight
 * tile's row 2g holds group g's even-indexed weights, 4 per column, and row 2g + 1 its odd ones:
 * the vectors the VNNI kernel already unpacks (`lo`, `hi`), stored instead of multiplied.
 *   tiles 0, 1  sums: rows x 16 columns of int32 (panels 0-1 and 2-3 of a 4-panel strip);
 *               tiles 5, 6 the same for every other block
 *   tile 2      activations: rows x 64 (one chunk of 64 weights of the block)
 *   tiles 3, 4  weights: 16 x 64 (the chunk's 64 weights of 16 columns, 4 per column a row)
 * From 17 to 32 rows (amx_rows2) tiles 5, 6 hold the second tile of rows' sums, its activations
 * loaded into tile 2 after the first's, so each chunk of weights is unpacked and loaded once.
 */

#define AMX_TARGET TILE_TARGET_VNNI ",amx-tile,amx-int8"
#define AMX_INLINE __attribute__((target(AMX_TARGET), always_inline)) static inline
#define AMX_ROWS 16 /* rows of one tile */
_Static_assert(STRIP_PANELS == 4, "a task's strip is the 4 panels of two sum tiles");

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16]; /* bytes per row, per tile register */
  uint8_t rows[16];
} TileConfig;

/* Tile shapes for `rows` activation rows, loaded only where the thread's differ: ldtilecfg
 * waits for every tile instruction in flight (about 50 ns, 10% of an 8-row projection when it
 * ran per strip), reading the shapes back costs 6. Read back, not remembered: another library
 * on the thread (ONNX Runtime's own AMX kernels) may have set or released them. Tile 7 stays
 * unconfigured: ONNX Runtime's kernels reload their shapes (every tile 16 x 64) only where both
 * a width and a row count differ from theirs, so with all 8 tiles 64 bytes wide they ran on our
 * row counts and faulted (SIGILL). */
AMX_INLINE void amx_configure(int rows) {
  TileConfig config __attribute__((aligned(64))), current __attribute__((aligned(64)));
  memset(&config, 0, sizeof config);
  config.palette = 1;
  for (int t = 0; t < 7; t++) {
    config.rows[t] = t == 3 || t == 4 ? 16 : (uint8_t)rows;
    config.colsb[t] = 64;
  }
  _tile_storeconfig(&current);
  if (memcmp(&config, &current, sizeof config) != 0) _tile_loadconfig(&config);
}

/* One chunk of 64 weights x 4 panels from `w` (the first panel's, `panel` bytes apart) into two
 * weight tiles' rows: the vectors VNNI multiplies, stored. */
AMX_INLINE void amx_unpack(const uint8_t *w, int64_t panel, const int bits,
                           uint8_t tiles[2][16][64]) {
  for (int g = 0; g < 8; g++)
    for (int half = 0; half < 2; half++) {
      __m512i lo, hi;
      unpack_pair_vnni(w + 8 * bits * g + 2 * half * panel, panel, bits, &lo, &hi);
      _mm512_store_si512(tiles[half][2 * g], lo);
      _mm512_store_si512(tiles[half][2 * g + 1], hi);
    }
}

/* Sums `pair` (0: tiles 0, 1; 1: tiles 5, 6) += the activations at `a` (rows `stride` bytes
 * apart) times one chunk of weights unpacked at `weights`. Blocks alternate pairs, so that a
 * block's tiles are stored while the next block multiplies into the other pair. */
AMX_INLINE void amx_multiply(const int8_t *a, int64_t stride, const uint8_t *weights,
                             const int pair) {
  _tile_loadd(2, a, stride);
  _tile_loadd(3, weights, 64);
  _tile_loadd(4, weights + 1024, 64);
  if (pair == 0) {
    _tile_dpbsud(0, 2, 3);
    _tile_dpbsud(1, 2, 4);
  } else {
    _tile_dpbsud(5, 2, 3);
    _tile_dpbsud(6, 2, 4);
  }
}

AMX_INLINE void amx_zero(const int pair) {
  if (pair == 0) {
    _tile_zero(0);
    _tile_zero(1);
  } else {
    _tile_zero(5);
    _tile_zero(6);
  }
}

/* Block sums out of `pair`'s tiles: rows x 16 columns each. */
typedef int32_t AmxSums[2][AMX_ROWS][16];

AMX_INLINE void amx_store(AmxSums sums, const int pair) {
  if (pair == 0) {
    _tile_stored(0, sums[0], 64);
    _tile_stored(1, sums[1], 64);
  } else {
    _tile_stored(5, sums[0], 64);
    _tile_stored(6, sums[1], 64);
  }
}

/* acc (rows x 2 vectors of 16 columns) += block `blk`'s `sums`, scaled as TILE(tile) scales a
 * block: sb * (sa * dot - correction). */
AMX_INLINE void amx_add_block(const MatMulTask *t, int64_t blk, int64_t row0, int rows,
                              const float *bscale, AmxSums sums, __m512 (*acc)[2]) {
  const QuantizedRows *r = t->rows;
  const float *first = bscale + blk * 8;
  const __m512 sb0 = pair_of_floats_vnni(first, first + t->panel_scales);
  const __m512 sb1 = pair_of_floats_vnni(first + 2 * t->panel_scales, first + 3 * t->panel_scales);
  const float *sa = r->scales + blk * r->rows + row0;
  const float *corrections = r->corrections + blk * r->rows + row0;
  for (int m = 0; m < rows; m++) {
    const __m512 sa_m = _mm512_set1_ps(sa[m]), correction = _mm512_set1_ps(corrections[m]);
    __m512 dot0 = _mm512_cvtepi32_ps(_mm512_load_si512(sums[0][m]));
    __m512 dot1 = _mm512_cvtepi32_ps(_mm512_load_si512(sums[1][m]));
    acc[m][0] = _mm512_fmadd_ps(_mm512_fmsub_ps(dot0, sa_m, correction), sb0, acc[m][0]);
    acc[m][1] = _mm512_fmadd_ps(_mm512_fmsub_ps(dot1, sa_m, correction), sb1, acc[m][1]);
  }
}

/* Unpacks chunk `chunk` of the 4 panels at `b` into `weights`, asking for the next strip's
 * panels (as TILE(tile) explains) on the way. */
AMX_INLINE void amx_fetch(const uint8_t *b, int64_t chunk, int64_t panel, const int bits,
                          uint8_t *weights) {
  const uint8_t *w = b + 64 * bits * chunk;
  for (int c = 0; c < 4; c++)
    for (int line = 0; line < bits; line++)
      _mm_prefetch((const char *)(w + (4 + c) * panel + 64 * line), _MM_HINT_T1);
  amx_unpack(w, panel, bits, (uint8_t(*)[16][64])weights);
}

/* Where a strip's unpacked weights come from. One tile of rows (decoding): a ring of 3 chunks,
 * each unpacked two chunks ahead of its multiply, since a tile load of bytes just stored waits
 * for the stores (2 KB stored and loaded back: 24 ns a chunk; other bytes: 10.6). The ring stays
 * in L1, where a whole strip unpacked first (up to 152 KB) did not: at 8 rows that took 1.4x as
 * long. Up to two tiles of rows (decoding, verifying drafts) share the ring (amx_rows2); more
 * rows (a prefill): the whole strip unpacked once, for every pair of tiles of rows. */
typedef struct {
  const uint8_t *b;
  int64_t panel, chunks;
  uint8_t *unpacked;
  int ring;
} AmxWeights;

AMX_INLINE const uint8_t *amx_chunk(const AmxWeights *w, int64_t chunk, const int bits) {
  if (!w->ring) return w->unpacked + 2048 * chunk;
  if (chunk + 2 < w->chunks)
    amx_fetch(w->b, chunk + 2, w->panel, bits, w->unpacked + 2048 * ((chunk + 2) % 3));
  return w->unpacked + 2048 * (chunk % 3);
}

/* Block `blk` of rows [row0, row0 + rows) times the strip, into `pair`'s tiles and out to
 * `sums`. */
AMX_INLINE void amx_block(const MatMulTask *t, const AmxWeights *w, int64_t blk, int64_t row0,
                          const int groups, const int bits, AmxSums sums, const int pair) {
  const QuantizedRows *r = t->rows;
  const int8_t *a = r->q + (blk * r->rows + row0) * r->block;
  amx_zero(pair);
  for (int within = 0; within < groups / 8; within++)
    amx_multiply(a + 64 * within, r->block, amx_chunk(w, blk * (groups / 8) + within, bits), pair);
  amx_store(sums, pair);
}

/* Y for rows [row0, row0 + rows) (at most AMX_ROWS) and the strip's 4 panels from panel p, as
 * TILE(tile). A block's sums are scaled a block later, while the next block multiplies: read
 * back at once, the vector loads waited for the tile stores
 * (bench/results/2026-11-26-kernel-notes.md). */
AMX_INLINE void amx_rows(const MatMulTask *t, const AmxWeights *w, int64_t p, int64_t row0,
                         int rows, const int groups, const int bits) {
  const int64_t blocks = t->rows->blocks;
  const float *bscale = t->scales + p * t->panel_scales;
  AmxSums sums[2] __attribute__((aligned(64)));
  __m512 acc[AMX_ROWS][2];
  for (int m = 0; m < rows; m++) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  amx_configure(rows);
  for (int64_t blk = 0; blk < blocks; blk += 2) {
    amx_block(t, w, blk, row0, groups, bits, sums[0], 0);
    if (blk > 0) amx_add_block(t, blk - 1, row0, rows, bscale, sums[1], acc);
    if (blk + 1 < blocks) {
      amx_block(t, w, blk + 1, row0, groups, bits, sums[1], 1);
      amx_add_block(t, blk, row0, rows, bscale, sums[0], acc);
    }
  }
  amx_add_block(t, blocks - 1, row0, rows, bscale, sums[(blocks - 1) % 2], acc);
  store_pairs_vnni(t, rows, 2, &acc[0][0], 2, t->bias != NULL ? t->bias + p * 8 : NULL,
                   out_at_vnni(t, row0, p));
}

/* amx_block for two tiles of rows, row0.. into tiles 0, 1 and row0 + AMX_ROWS.. into tiles 5,
 * 6: each chunk's weight tiles are loaded once and multiplied by both tiles of activations. The
 * second is loaded whole (AMX_ROWS rows): the rows past the batch's are the next block's, or
 * past the last block the padding QuantizedRows keeps, and their sums are never read. */
AMX_INLINE void amx_block2(const MatMulTask *t, const AmxWeights *w, int64_t blk, int64_t row0,
                           const int groups, const int bits, AmxSums sums[2]) {
  const QuantizedRows *r = t->rows;
  const int8_t *a = r->q + (blk * r->rows + row0) * r->block;
  const int8_t *second = a + AMX_ROWS * r->block;
  amx_zero(0);
  amx_zero(1);
  for (int within = 0; within < groups / 8; within++) {
    amx_multiply(a + 64 * within, r->block, amx_chunk(w, blk * (groups / 8) + within, bits), 0);
    _tile_loadd(2, second + 64 * within, r->block);
    _tile_dpbsud(5, 2, 3);
    _tile_dpbsud(6, 2, 4);
  }
  amx_store(sums[0], 0);
  amx_store(sums[1], 1);
}

/* amx_rows for AMX_ROWS < rows <= 2 * AMX_ROWS: two tiles of rows in one pass over the strip.
 * As two passes of amx_rows, the weights were unpacked twice, or (as every prefill still does
 * past 2 * AMX_ROWS) unpacked once into a buffer that spills out of L1: a projection at 17 rows
 * took 1.4-1.8x its time at 16, and a decode step of 8 streams verifying 2 drafts each (24
 * rows) 1.6x the step verifying 1; now 24 rows cost about what 16 do (figures:
 * bench/results/2026-11-27-amx-two-row-tiles-amx-xeon.md). A block's sums are scaled a block
 * later, as in amx_rows. */
AMX_INLINE void amx_rows2(const MatMulTask *t, const AmxWeights *w, int64_t p, int64_t row0,
                          int rows, const int groups, const int bits) {
  const int64_t blocks = t->rows->blocks;
  const float *bscale = t->scales + p * t->panel_scales;
  AmxSums sums[2][2] __attribute__((aligned(64))); /* [block % 2][tile of rows] */
  __m512 acc[2 * AMX_ROWS][2];
  for (int m = 0; m < rows; m++) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  amx_configure(AMX_ROWS);
  for (int64_t blk = 0; blk <= blocks; blk++) {
    if (blk < blocks) amx_block2(t, w, blk, row0, groups, bits, sums[blk % 2]);
    if (blk == 0) continue;
    AmxSums *done = sums[(blk - 1) % 2];
    amx_add_block(t, blk - 1, row0, AMX_ROWS, bscale, done[0], acc);
    amx_add_block(t, blk - 1, row0 + AMX_ROWS, rows - AMX_ROWS, bscale, done[1], acc + AMX_ROWS);
  }
  store_pairs_vnni(t, rows, 2, &acc[0][0], 2, t->bias != NULL ? t->bias + p * 8 : NULL,
                   out_at_vnni(t, row0, p));
}

/* A thread's buffer for a strip's unpacked weights: grown as needed, freed with the thread. */
static pthread_key_t g_amx_buffer_key;
static pthread_once_t g_amx_buffer_once = PTHREAD_ONCE_INIT;
typedef struct {
  uint8_t *data;
  size_t size;
} AmxBuffer;

static void free_amx_buffer(void *buffer) {
  free(((AmxBuffer *)buffer)->data);
  free(buffer);
}

static void make_amx_buffer_key(void) { pthread_key_create(&g_amx_buffer_key, free_amx_buffer); }

static uint8_t *amx_buffer(size_t size) {
  pthread_once(&g_amx_buffer_once, make_amx_buffer_key);
  AmxBuffer *buffer = pthread_getspecific(g_amx_buffer_key);
  if (buffer == NULL) {
    buffer = calloc(1, sizeof(AmxBuffer));
    if (buffer == NULL || pthread_setspecific(g_amx_buffer_key, buffer) != 0) {
      free(buffer);
      return NULL;
    }
  }
  if (buffer->size < size) {
    free(buffer->data);
    buffer->data = aligned_alloc(64, size);
    buffer->size = buffer->data != NULL ? size : 0;
  }
  return buffer->data;
}

/* Every row times the strip of 4 panels from panel p. */
AMX_INLINE void amx_strip(const MatMulTask *t, int64_t p, const int groups, const int bits) {
  const int64_t all_rows = t->rows->rows, chunks = t->rows->blocks * groups / 8;
  uint8_t ring[3 * 2048] __attribute__((aligned(64)));
  AmxWeights w = {.b = t->b + p * t->panel_bytes,
                  .panel = t->panel_bytes,
                  .chunks = chunks,
                  .unpacked = all_rows > 2 * AMX_ROWS ? amx_buffer((size_t)chunks * 2048) : NULL};
  w.ring = w.unpacked == NULL; /* also where the buffer could not be had */
  if (w.ring)
    w.unpacked = ring;
  else
    for (int64_t chunk = 0; chunk < w.chunks; chunk++)
      amx_fetch(w.b, chunk, w.panel, bits, w.unpacked + 2048 * chunk);
  for (int64_t row0 = 0; row0 < all_rows; row0 += 2 * AMX_ROWS) {
    if (w.ring) /* the first two chunks; amx_chunk fetches the rest as it goes */
      for (int64_t chunk = 0; chunk < 2 && chunk < w.chunks; chunk++)
        amx_fetch(w.b, chunk, w.panel, bits, ring + 2048 * chunk);
    int rows = (int)(all_rows - row0 < 2 * AMX_ROWS ? all_rows - row0 : 2 * AMX_ROWS);
    if (rows > AMX_ROWS)
      amx_rows2(t, &w, p, row0, rows, groups, bits);
    else
      amx_rows(t, &w, p, row0, rows, groups, bits);
  }
}

/* One parallel task, as TILE(multiply_strip): strips of 4 panels with AMX_MIN_ROWS rows or more
 * on tiles, the rest on VNNI. */
AMX_INLINE void amx_multiply_strip(void *data, size_t strip, const int bits) {
  const MatMulTask *t = data;
  int64_t first = (int64_t)strip * STRIP_PANELS;
  if (t->rows->rows < AMX_MIN_ROWS || first + 4 > t->n / 8) {
    (bits == 4 ? multiply_strip4_vnni : multiply_strip8_vnni)(data, strip);
    return;
  }
  switch (t->rows->block / 8) {
    case 8: amx_strip(t, first, 8, bits); break;
    case 16: amx_strip(t, first, 16, bits); break;
    case 32: amx_strip(t, first, 32, bits); break;
    default: break; /* refused when the kernel is created */
  }
}

__attribute__((target(AMX_TARGET))) static void multiply_strip4_amx(void *data, size_t strip) {
  amx_multiply_strip(data, strip, 4);
}

__attribute__((target(AMX_TARGET))) static void multiply_strip8_amx(void *data, size_t strip) {
  amx_multiply_strip(data, strip, 8);
}
