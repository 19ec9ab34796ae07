"""Mask semantics: segments, prefix, mixed forward/backward."""
import jax.numpy as jnp
import numpy as np

from t5like.models import masks


def test_prefix_mask_bidirectional_over_prefix_causal_after():
  seg = jnp.ones((1, 6), jnp.int32)
  prefix = jnp.array([[1, 1, 1, 0, 0, 0]])
  m = np.asarray(masks.self_attention_mask(seg, kind="prefix", prefix_bt=prefix))[0, 0]
  assert m[:3, :3].all()  # Prefix positions see each other both ways.
  assert m[0, 2] and m[1, 2]
  for q in range(3, 6):  # Later positions are causal and see the whole prefix.
    assert m[q, :q + 1].all() and not m[q, q + 1:].any()
  assert not m[:3, 3:].any()  # The prefix never sees the targets.


def test_segments_isolate_and_padding_sees_nothing():
  seg = jnp.array([[1, 1, 2, 2, 0]])
  m = np.asarray(masks.self_attention_mask(seg, kind="bidirectional"))[0, 0]
  expected = np.array([[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 0],
                       [0, 0, 0, 0, 0]], bool)
  np.testing.assert_array_equal(m, expected)
  cross = np.asarray(masks.cross_attention_mask(jnp.array([[1, 2, 2]]), seg))[0, 0]
  np.testing.assert_array_equal(cross, expected[[0, 2, 3]])


def test_mixed_per_head_is_exactly_triangular():
  t, heads = 5, 4
  seg = jnp.ones((1, t), jnp.int32)
  m = np.asarray(masks.self_attention_mask(seg, kind="bidirectional", mixed="per_head",
                                           num_heads=heads))[0]
  lower, upper = np.tril(np.ones((t, t), bool)), np.triu(np.ones((t, t), bool))
  for h in range(heads):
    np.testing.assert_array_equal(m[h], lower if h < heads // 2 else upper)


def test_mixed_per_layer_direction_and_prefix_region():
  t = 5
  seg = jnp.ones((1, t), jnp.int32)
  fwd = np.asarray(masks.self_attention_mask(seg, kind="bidirectional", mixed="per_layer",
                                             backward=False))[0, 0]
  bwd = np.asarray(masks.self_attention_mask(seg, kind="bidirectional", mixed="per_layer",
                                             backward=True))[0, 0]
  np.testing.assert_array_equal(fwd, np.tril(np.ones((t, t), bool)))
  np.testing.assert_array_equal(bwd, np.triu(np.ones((t, t), bool)))
  # With a prefix, a backward layer is anti-causal inside the prefix only; targets stay causal.
  prefix = jnp.array([[1, 1, 1, 0, 0]])
  pb = np.asarray(masks.self_attention_mask(seg, kind="prefix", prefix_bt=prefix,
                                            mixed="per_layer", backward=True))[0, 0]
  np.testing.assert_array_equal(pb[:3, :3], np.triu(np.ones((3, 3), bool)))
  np.testing.assert_array_equal(pb[3:], np.tril(np.ones((t, t), bool))[3:])
