"""Chunked prefill's pieces: one chunk of C prompt positions attending over the cache, and its K/V written in.

Key: B batch, C positions per chunk, N query heads, K kv heads, G = N // K query heads per kv head, Q = G*C query
rows per kv head, H head dim, R ring slots, S full-cache slots, U keys of one block, W the sliding window.

`model.forward.prefill` runs the prompt through the cache layers one chunk at a time, in a loop whose trip count
is the number of REAL chunks: chunk c holds positions cC .. cC+C-1, and every chunk but the last is all real. Each
chunk attends before it writes, so the cache these functions read holds exactly the positions before the chunk
(the invariant of `model.cache`: a slot holds one real position or its old content, never padding):
- sliding layers read the chunk's own keys, then the ring: only the blocks of C slots written so far until it is
  full, then all R slots at once, merged by an online softmax;
- full layers read the chunk's own keys, then the c blocks of C slots before it, merged the same way:
  about n^2 / 2 query-key pairs for n positions, not n * S.
Both equal `model.layers.attend` with the causal (and window) mask up to float summation order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from model.cache import ring_positions


def write_slots(buf_BKSH: jax.Array, x_BKCH: jax.Array, slot_C: jax.Array, real_C: jax.Array) -> jax.Array:
    """A chunk's K or V [B,K,C,H] written into slots `slot_C` [C] (int32) of a cache buffer [B,K,S,H] where
    `real_C` (bool: position < length) holds: [C] for every row alike, or [B,C] per row (rows of different
    lengths); every other slot keeps its content, and a slot index >= S (a padding position past the cache's end)
    is dropped. The slots of one chunk must be distinct."""
    x_BKCH = x_BKCH.astype(buf_BKSH.dtype)
    old_BKCH = jnp.take(buf_BKSH, slot_C, axis=2, mode="clip")  # a clipped index is never real: dropped below
    real_BKCH = real_C[None, None, :, None] if real_C.ndim == 1 else real_C[:, None, :, None]
    new_BKCH = jnp.where(real_BKCH, x_BKCH, old_BKCH)
    return buf_BKSH.at[:, :, slot_C].set(new_BKCH, mode="drop")


def attend_ring_chunk(
    q_BCNH: jax.Array,
    k_BKCH: jax.Array,
    v_BKCH: jax.Array,
    ring_k_BKRH: jax.Array | None,
    ring_v_BKRH: jax.Array | None,
    start: jax.Array,
    length: jax.Array,
    window: int,
) -> jax.Array:
    """Sliding-window attention of the chunk at positions start .. start+C-1 (start a multiple of C, C <= R)
    over the ring as it was before the chunk (slot s holds `ring_positions(start, R)[s]`, -1 when empty) and
    the chunk's own keys; a ring of None is an empty one (the prompt's only chunk), then only the chunk's C keys
    are read.

    Key j is visible from query i iff j is a held position, j <= i, j > i - window and j < length (padding
    never visible). A query's window lies inside these R + C keys, as the ring holds the R >= C positions just
    before the chunk. Returns [B,C,N,H] in q's dtype.

    Until the ring is full, only the slots written so far are read: when C divides R (or the ring is shorter
    than the window, so it never wraps), positions start - jC .. start - jC + C - 1 (j = 1 .. start // C) lie in
    C consecutive slots, and the chunk reads its own keys and then those blocks, merged by the online softmax of
    `attend_full_chunk`. Once the ring is full (start >= R, or always when C does not divide a wrapping ring),
    the whole ring is one block of R keys: one larger product, which measured faster than R / C blocks of C on
    the default preset (paired prefill at 2057 and 3593 tokens). At 521 tokens (5 chunks of 128, R = W = 512)
    the chunks read 10 + 5 blocks of keys instead of 25.
    """
    c = q_BCNH.shape[1]
    qpos_C = start + jnp.arange(c, dtype=jnp.int32)
    if ring_k_BKRH is None or ring_v_BKRH is None:
        return _attend_blocks(q_BCNH, k_BKCH, v_BKCH, start, length, 0, None)
    ring = ring_k_BKRH.shape[2]

    def whole_ring(_):  # one block of R keys: every slot, masked by the position it holds (-1: empty)
        kpos_R = ring_positions(start, ring)
        vis_CR = (kpos_R[None, :] >= 0) & (kpos_R[None, :] > qpos_C[:, None] - window)
        return _attend_blocks(q_BCNH, k_BKCH, v_BKCH, start, length, 1, lambda t: (ring_k_BKRH, ring_v_BKRH, vis_CR))

    def ring_blocks(_):  # the start // C blocks of C slots written so far, newest first
        def block(t):
            first = start - (t + 1) * c  # block t holds positions first .. first + C - 1, all real (< start)
            kb_BKCH = jax.lax.dynamic_slice_in_dim(ring_k_BKRH, jnp.mod(first, ring), c, axis=2)
            vb_BKCH = jax.lax.dynamic_slice_in_dim(ring_v_BKRH, jnp.mod(first, ring), c, axis=2)
            return kb_BKCH, vb_BKCH, (first + jnp.arange(c, dtype=jnp.int32))[None, :] > qpos_C[:, None] - window

        return _attend_blocks(q_BCNH, k_BKCH, v_BKCH, start, length, start // c, block)

    if ring % c == 0 or ring < window:  # blocks of C consecutive slots: read only those written
        return jax.lax.cond(start // c >= ring // c, whole_ring, ring_blocks, None)
    return whole_ring(None)


def _kv_major(q_BCNH: jax.Array, kv_heads: int) -> jax.Array:
    """[B,C,N,H] -> [B,K,Q,H] with the G query heads of a kv head interleaved by position (row t*G + g): with
    one kv head (E2B) this is a free reshape, where rows g*C + t made XLA:CPU transpose q (and the output back)
    in every layer of every chunk, about 0.8 ms each at C = 128 on the default preset."""
    b, c, n, h = q_BCNH.shape
    q_BCKGH = q_BCNH.reshape(b, c, kv_heads, n // kv_heads, h)
    return jnp.transpose(q_BCKGH, (0, 2, 1, 3, 4)).reshape(b, kv_heads, c * (n // kv_heads), h)


def _block(q_BKQH, k_BKCH, v_BKCH, vis_QC=None):
    """Scores of one key block (float32, masked to -inf where not visible): (row max m, sum of exp l, exp @ v);
    m is -inf (and l, exp @ v are 0) for a row that sees none of the block's keys."""
    s_BKQC = jnp.einsum("BKQH,BKCH->BKQC", q_BKQH, k_BKCH, preferred_element_type=jnp.float32)
    if vis_QC is not None:
        s_BKQC = jnp.where(vis_QC, s_BKQC, -jnp.inf)
    m_BKQ1 = jnp.max(s_BKQC, axis=-1, keepdims=True)
    # A row with no visible key (a ring block wholly before a query's window) has max -inf: exp against 0 gives
    # p = 0, l = 0, acc = 0, and the merge weighs the block by exp(-inf - m) = 0, where -inf - -inf gave NaN.
    p_BKQC = jnp.exp(s_BKQC - jnp.where(jnp.isneginf(m_BKQ1), 0.0, m_BKQ1))
    acc_BKQH = jnp.einsum("BKQC,BKCH->BKQH", p_BKQC.astype(v_BKCH.dtype), v_BKCH, preferred_element_type=jnp.float32)
    return m_BKQ1, jnp.sum(p_BKQC, axis=-1, keepdims=True), acc_BKQH


def attend_full_chunk(
    q_BCNH: jax.Array,
    k_BKCH: jax.Array,
    v_BKCH: jax.Array,
    cache_k_BKSH: jax.Array,
    cache_v_BKSH: jax.Array,
    start: jax.Array,
    length: jax.Array,
) -> jax.Array:
    """Causal full attention of the chunk at positions start .. start+C-1 (start a multiple of C, start <
    length) over every position up to its own: its own keys (j <= i, j < length), then the start // C blocks of
    C cache slots before it (all real and visible), in a loop of start // C trips.

    The blocks are merged by the online softmax of flash attention (Dao et al. 2022, "FlashAttention", §3.1), in
    float32: running row max m, denominator l and numerator acc; a block with max m' rescales them by
    exp(m - max(m, m')). Every row sees at least its chunk's first key (position start < length), so m stays
    finite and the -inf of masked scores contributes exp(-inf) = 0. Returns [B,C,N,H] in q's dtype.
    """
    c = q_BCNH.shape[1]

    def cache_block(j):
        kb_BKCH = jax.lax.dynamic_slice_in_dim(cache_k_BKSH, j * c, c, axis=2)
        vb_BKCH = jax.lax.dynamic_slice_in_dim(cache_v_BKSH, j * c, c, axis=2)
        return kb_BKCH, vb_BKCH, None

    return _attend_blocks(q_BCNH, k_BKCH, v_BKCH, start, length, start // c, cache_block)


def _attend_blocks(q_BCNH, k_BKCH, v_BKCH, start, length, trips, block) -> jax.Array:
    """The chunk's queries over its own keys (j <= i, j < length), then over `trips` (int32, traced) blocks of U
    keys `block(t)` -> (k [B,K,U,H], v [B,K,U,H], visibility [C,U] or None for all visible), merged by the
    online softmax in float32. Returns [B,C,N,H] in q's dtype."""
    b, c, n, h = q_BCNH.shape
    kh = k_BKCH.shape[1]
    q_BKQH = _kv_major(q_BCNH, kh)
    pos_C = start + jnp.arange(c, dtype=jnp.int32)
    vis_CC = (pos_C[None, :] <= pos_C[:, None]) & (pos_C[None, :] < length)
    state = _block(q_BKQH, k_BKCH, v_BKCH, jnp.repeat(vis_CC, n // kh, axis=0))

    def merge(t, state):
        m_BKQ1, l_BKQ1, acc_BKQH = state
        kb_BKCH, vb_BKCH, vis = block(t)
        vis_QC = None if vis is None else jnp.repeat(vis, n // kh, axis=0)
        mb_BKQ1, lb_BKQ1, accb_BKQH = _block(q_BKQH, kb_BKCH.astype(k_BKCH.dtype), vb_BKCH.astype(v_BKCH.dtype), vis_QC)
        m_new = jnp.maximum(m_BKQ1, mb_BKQ1)
        old, new = jnp.exp(m_BKQ1 - m_new), jnp.exp(mb_BKQ1 - m_new)
        return m_new, l_BKQ1 * old + lb_BKQ1 * new, acc_BKQH * old + accb_BKQH * new

    with jax.named_scope("attention"):
        _, l_BKQ1, acc_BKQH = state if block is None else jax.lax.fori_loop(0, trips, merge, state)
        o_BKQH = (acc_BKQH / l_BKQ1).astype(q_BCNH.dtype)
    o_BCKGH = jnp.transpose(o_BKQH.reshape(b, kh, c, n // kh, h), (0, 2, 1, 3, 4))
    return o_BCKGH.reshape(b, c, n, h)
