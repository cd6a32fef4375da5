//! Criterion micro-benchmarks of the quantized kernels: one row dot and one
//! register-tiled block (the prefill GEMM's inner unit), SIMD against the
//! scalar twin, and the packed decode layouts where this CPU repacks, for
//! the formats of the two test models and Q6_K; and attention's block
//! products (scores and weighted values) in every vector table this CPU
//! runs.
//!
//!     cargo bench --bench kernels            # all
//!     cargo bench --bench kernels -- q4_1    # one format
//!     cargo bench --bench kernels -- attn    # attention's blocks

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use oxillama::ops::vec::{avx2_tables, scalar as scalar_vec};
use oxillama::quant::{
    kernels, pack_matrix, pack_panel, packed_side, packed_tile, panel_sizes, scalar_kernels,
    GgmlType, QuantKernels, GEMM_COLS,
};

/// Deterministic bytes, each masked with 0x3b so that every f16 scale field
/// (whatever its offset) has an exponent below 15: finite, as in a real file.
/// Timing does not depend on the values beyond that.
fn weight_bytes(ty: GgmlType, rows: usize, n: usize) -> Vec<u8> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let len = rows * ty.row_bytes(n).expect("whole blocks");
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8 & 0x3b
        })
        .collect()
}

fn act_bytes(k: &QuantKernels, cols: usize, n: usize) -> Vec<Vec<u8>> {
    (0..cols)
        .map(|c| {
            let src: Vec<f32> = (0..n)
                .map(|i| ((i * 31 + c * 7) % 97) as f32 / 97.0 - 0.5)
                .collect();
            let mut dst = vec![0u8; k.act.row_bytes(n).expect("whole blocks")];
            (k.quantize_act)(&src, &mut dst);
            dst
        })
        .collect()
}

const FORMATS: [GgmlType; 11] = [
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4K,
    GgmlType::Q6K,
    GgmlType::IQ4XS,
    GgmlType::IQ3S,
    GgmlType::IQ3XXS,
    GgmlType::IQ2XXS,
    GgmlType::TQ2_0,
    GgmlType::MXFP4,
];

fn bench(c: &mut Criterion) {
    let (n, rows, cols) = (2048usize, 16usize, 8usize);
    for ty in FORMATS {
        let simd = kernels(ty).expect("kernels");
        let scalar = scalar_kernels(ty).expect("scalar kernels");
        let w = weight_bytes(ty, rows, n);
        let rb = ty.row_bytes(n).expect("whole blocks");
        let w_rows: Vec<&[u8]> = w.chunks(rb).collect();
        let acts = act_bytes(simd, cols, n);
        let a_rows: Vec<&[u8]> = acts.iter().map(|a| a.as_slice()).collect();
        let mut g = c.benchmark_group(ty.name().to_lowercase());
        g.throughput(Throughput::Elements((n * rows * cols) as u64));
        for (name, k) in [("simd", simd), ("scalar", scalar)] {
            let mut out = vec![0f32; rows];
            g.throughput(Throughput::Elements((n * rows) as u64));
            g.bench_function(BenchmarkId::new("tile16x1", name), |b| {
                b.iter(|| {
                    (k.vec_dot_tile)(n, black_box(&w_rows), black_box(&a_rows[..1]), &mut out)
                })
            });
            g.throughput(Throughput::Elements((n * rows * cols) as u64));
            let mut out = vec![0f32; rows * cols];
            g.bench_function(BenchmarkId::new("tile16x8", name), |b| {
                b.iter(|| (k.vec_dot_tile)(n, black_box(&w_rows), black_box(&a_rows), &mut out))
            });
        }
        if let (Some(gs), Some(gr)) = (simd.gemm, scalar.gemm) {
            let cols8 = &a_rows[..GEMM_COLS];
            let (qb, sb) = panel_sizes(simd.act, n);
            let mut quants = vec![0u8; qb];
            let mut scales = vec![0f32; sb];
            pack_panel(simd.act, cols8, n, &mut quants, &mut scales);
            for (name, f) in [("simd", gs), ("scalar", gr)] {
                let mut out = vec![0f32; rows * GEMM_COLS];
                g.bench_function(BenchmarkId::new("gemm16x8", name), |b| {
                    b.iter(|| {
                        f(
                            n,
                            black_box(&w_rows),
                            black_box(cols8),
                            &quants,
                            &scales,
                            &mut out,
                        )
                    })
                });
            }
        }
        // The decode layout: sixteen rows against one token and eight.
        if let Some(packed) = pack_matrix(ty, rows, n, &w) {
            for (name, t) in [("packed16x1", 1), ("packed16x8", cols)] {
                let mut bufs = vec![vec![0f32; rows]; t];
                // Once per product, as `matmul_multi` does.
                let mut side = Vec::new();
                packed_side(ty, n, &a_rows[..t], &mut side);
                g.throughput(Throughput::Elements((n * rows * t) as u64));
                g.bench_function(BenchmarkId::new(name, "simd"), |b| {
                    b.iter(|| {
                        let mut outs: Vec<&mut [f32]> =
                            bufs.iter_mut().map(|v| v.as_mut_slice()).collect();
                        packed_tile(
                            ty,
                            n,
                            black_box(&packed),
                            (0, rows / 16),
                            &a_rows[..t],
                            &side,
                            &mut outs,
                        )
                    })
                });
            }
        }
        g.throughput(Throughput::Elements(n as u64));
        for (name, k) in [("simd", simd), ("scalar", scalar)] {
            g.bench_function(BenchmarkId::new("dot", name), |b| {
                b.iter(|| (k.vec_dot)(n, black_box(w_rows[0]), black_box(a_rows[0])))
            });
        }
        g.finish();
    }
}

/// Attention's block products on one 16-row tile: a prefill block (32
/// queries) and a decode step's group of query heads (3, as SmolLM2's nine
/// heads over three KV heads), at head widths 64 and 128; for the group,
/// also over an f16 tile, converted first or read as stored.
fn bench_attention(c: &mut Criterion) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let rows = 16;
    let mut tables = vec![scalar_vec()];
    tables.extend(avx2_tables());
    for d in [64usize, 128, 256] {
        let mut g = c.benchmark_group(format!("attn_d{d}"));
        let tile: Vec<f32> = (0..rows * d).map(|_| next()).collect();
        let half_tile: Vec<u16> = tile
            .iter()
            .map(|&x| half::f16::from_f32(x).to_bits())
            .collect();
        for m in [3usize, 4, 32] {
            let q: Vec<f32> = (0..m * d).map(|_| next()).collect();
            let qs: Vec<&[f32]> = q.chunks_exact(d).collect();
            let w: Vec<f32> = (0..m * rows).map(|_| next()).collect();
            g.throughput(Throughput::Elements((m * rows * d) as u64));
            for k in &tables {
                let mut out = vec![0f32; m * rows];
                g.bench_function(BenchmarkId::new(format!("scores_q{m}"), k.name), |b| {
                    b.iter(|| (k.dot_block)(black_box(&qs), black_box(&tile), &mut out, rows))
                });
                let mut ys = vec![vec![0f32; d]; m];
                g.bench_function(BenchmarkId::new(format!("values_q{m}"), k.name), |b| {
                    b.iter(|| {
                        let mut refs: Vec<&mut [f32]> =
                            ys.iter_mut().map(|y| y.as_mut_slice()).collect();
                        (k.axpy_block)(&mut refs, black_box(&w), rows, black_box(&tile))
                    })
                });
                if m > 8 {
                    continue;
                }
                // An f16 cache's tile: converted to f32 first (as a prefill
                // block does) against read as stored (a decode step).
                let mut buf = vec![0f32; rows * d];
                g.bench_function(
                    BenchmarkId::new(format!("scores_q{m}_f16_convert"), k.name),
                    |b| {
                        b.iter(|| {
                            (k.f16_to_f32)(black_box(&half_tile), &mut buf);
                            (k.dot_block)(black_box(&qs), &buf, &mut out, rows)
                        })
                    },
                );
                g.bench_function(BenchmarkId::new(format!("scores_q{m}_f16"), k.name), |b| {
                    b.iter(|| {
                        (k.dot_block_f16)(black_box(&qs), black_box(&half_tile), &mut out, rows)
                    })
                });
                g.bench_function(
                    BenchmarkId::new(format!("values_q{m}_f16_convert"), k.name),
                    |b| {
                        b.iter(|| {
                            (k.f16_to_f32)(black_box(&half_tile), &mut buf);
                            let mut refs: Vec<&mut [f32]> =
                                ys.iter_mut().map(|y| y.as_mut_slice()).collect();
                            (k.axpy_block)(&mut refs, black_box(&w), rows, &buf)
                        })
                    },
                );
                g.bench_function(BenchmarkId::new(format!("values_q{m}_f16"), k.name), |b| {
                    b.iter(|| {
                        let mut refs: Vec<&mut [f32]> =
                            ys.iter_mut().map(|y| y.as_mut_slice()).collect();
                        (k.axpy_block_f16)(&mut refs, black_box(&w), rows, black_box(&half_tile))
                    })
                });
            }
        }
        g.finish();
    }
}

criterion_group!(benches, bench, bench_attention);
criterion_main!(benches);
