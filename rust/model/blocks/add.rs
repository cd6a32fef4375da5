//! The elementwise adds the blocks and the layers share, kept apart from
//! `mod.rs` so that the blocks import them without importing their parent.

use crate::threadpool::ThreadPool;

/// `x += scale * y` (the residual add; `scale` is 1 except for Granite),
/// spread over `pool` when long.
pub fn residual_add(pool: &ThreadPool, x: &mut [f32], y: &[f32], scale: f32) {
    assert_eq!(x.len(), y.len());
    pool.for_rows(x, 1, |i0, x| {
        let y = &y[i0..i0 + x.len()];
        if scale == 1.0 {
            x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
        } else {
            x.iter_mut().zip(y).for_each(|(a, b)| *a += b * scale);
        }
    });
}

/// Adds `bias` to every row of `buf`.
pub fn add_bias(buf: &mut [f32], bias: &[f32]) {
    for row in buf.chunks_exact_mut(bias.len()) {
        row.iter_mut().zip(bias).for_each(|(x, y)| *x += y);
    }
}
