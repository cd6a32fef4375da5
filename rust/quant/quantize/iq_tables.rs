//! The search tables of the codebook quantizers (IQ3, IQ2 and IQ1), built
//! once on first use from the codebooks in `iq_grids`, as ggml's
//! `iq3xs_init_impl` / `iq2xs_init_impl` build theirs.
//!
//! A grid point is a group of `dim` levels `l`, kept as `2l + 1`. The
//! `kmap` turns a group's packed levels (`bits` bits each) into its grid
//! index, or, for a group not on the grid, into a list of the grid points
//! at the `nwant` smallest squared distances from it, ordered by distance
//! then index. The lists must hold the same points in the same order as
//! ggml's: the nearest-neighbour search keeps the first of equal scores.

use std::sync::OnceLock;

use super::super::iq_grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID,
};

pub struct GridTable {
    /// Levels per group: 8 (IQ2, IQ1) or 4 (IQ3).
    pub dim: usize,
    /// `grid_size * dim` values `2l + 1`.
    points: Vec<i8>,
    /// Packed levels to grid index, or `-(offset + 1)` into `neighbours`.
    kmap: Vec<i32>,
    /// Per off-grid group: a count, then that many grid indices.
    neighbours: Vec<u16>,
}

/// Where a group of levels falls.
pub enum Lookup<'a> {
    OnGrid(usize),
    /// The candidate grid indices, nearest first.
    Near(&'a [u16]),
}

impl GridTable {
    /// `levels[k]` are the grid points' levels; `bits` per packed level;
    /// `n_levels` the levels a quantizer can ask for (packed groups with a
    /// larger level are never looked up, so they get no list).
    fn build(levels: Vec<Vec<u8>>, bits: u32, n_levels: usize, nwant: usize) -> Self {
        let dim = levels[0].len();
        let kmap_size = 1usize << (bits as usize * dim);
        let mask = (1usize << bits) - 1;
        let mut points = Vec::with_capacity(levels.len() * dim);
        let mut kmap = vec![-1i32; kmap_size];
        for (k, g) in levels.iter().enumerate() {
            let mut index = 0usize;
            for (i, &l) in g.iter().enumerate() {
                points.push(2 * l as i8 + 1);
                index |= (l as usize) << (bits as usize * i);
            }
            kmap[index] = k as i32;
        }
        let grid_size = levels.len();
        let mut neighbours = Vec::new();
        let mut d2 = vec![0i32; grid_size];
        let mut near: Vec<(i32, u16)> = Vec::new();
        for i in 0..kmap_size {
            if kmap[i] >= 0 || (0..dim).any(|k| (i >> (bits as usize * k)) & mask >= n_levels) {
                continue;
            }
            let pos: Vec<i32> = (0..dim)
                .map(|k| 2 * ((i >> (bits as usize * k)) & mask) as i32 + 1)
                .collect();
            for (j, d) in d2.iter_mut().enumerate() {
                let pg = &points[j * dim..(j + 1) * dim];
                *d = pos
                    .iter()
                    .zip(pg)
                    .map(|(&p, &g)| (g as i32 - p) * (g as i32 - p))
                    .sum();
            }
            // The nwant-th smallest distinct distance bounds the list.
            let mut bound = i32::MIN;
            for _ in 0..nwant {
                match d2.iter().copied().filter(|&d| d > bound).min() {
                    Some(d) => bound = d,
                    None => break,
                }
            }
            near.clear();
            near.extend(
                d2.iter()
                    .enumerate()
                    .filter(|&(_, &d)| d <= bound)
                    .map(|(j, &d)| (d, j as u16)),
            );
            near.sort_unstable();
            kmap[i] = -(neighbours.len() as i32 + 1);
            neighbours.push(near.len() as u16);
            neighbours.extend(near.iter().map(|&(_, j)| j));
        }
        GridTable {
            dim,
            points,
            kmap,
            neighbours,
        }
    }

    /// Grid point `k`'s values `2l + 1` (a point past the grid reads as
    /// the first one; the quantizers never ask for one).
    #[inline]
    pub fn point(&self, k: usize) -> &[i8] {
        let k = if k * self.dim < self.points.len() {
            k
        } else {
            0
        };
        &self.points[k * self.dim..(k + 1) * self.dim]
    }

    #[inline]
    pub fn lookup(&self, u: usize) -> Lookup<'_> {
        match self.kmap.get(u) {
            Some(&k) if k >= 0 => Lookup::OnGrid(k as usize),
            Some(&k) => {
                let off = (-(k + 1)) as usize;
                let n = self.neighbours[off] as usize;
                Lookup::Near(&self.neighbours[off + 1..off + 1 + n])
            }
            None => Lookup::OnGrid(0),
        }
    }

    /// The grid index of packed levels `u`, where they are on the grid.
    #[inline]
    pub fn index_of(&self, u: usize) -> Option<usize> {
        match self.lookup(u) {
            Lookup::OnGrid(k) => Some(k),
            Lookup::Near(_) => None,
        }
    }
}

/// Levels of a magnitude codebook: the position of each value in `map`.
fn levels_of<const N: usize>(grid: &[[u8; N]], map: &[u8]) -> Vec<Vec<u8>> {
    grid.iter()
        .map(|g| {
            g.iter()
                .map(|v| map.iter().position(|m| m == v).unwrap_or(0) as u8)
                .collect()
        })
        .collect()
}

const IQ2_MAP: [u8; 3] = [0x08, 0x19, 0x2b];
const IQ3XXS_MAP: [u8; 8] = [0x04, 0x0c, 0x14, 0x1c, 0x24, 0x2c, 0x34, 0x3e];
const IQ3S_MAP: [u8; 8] = [1, 3, 5, 7, 9, 11, 13, 15];

pub fn iq3xxs() -> &'static GridTable {
    static T: OnceLock<GridTable> = OnceLock::new();
    T.get_or_init(|| GridTable::build(levels_of(&IQ3XXS_GRID, &IQ3XXS_MAP), 3, 8, 2))
}

pub fn iq3s() -> &'static GridTable {
    static T: OnceLock<GridTable> = OnceLock::new();
    T.get_or_init(|| GridTable::build(levels_of(&IQ3S_GRID, &IQ3S_MAP), 3, 8, 3))
}

pub fn iq2xxs() -> &'static GridTable {
    static T: OnceLock<GridTable> = OnceLock::new();
    T.get_or_init(|| GridTable::build(levels_of(&IQ2XXS_GRID, &IQ2_MAP), 2, 3, 2))
}

pub fn iq2xs() -> &'static GridTable {
    static T: OnceLock<GridTable> = OnceLock::new();
    T.get_or_init(|| GridTable::build(levels_of(&IQ2XS_GRID, &IQ2_MAP), 2, 3, 2))
}

pub fn iq2s() -> &'static GridTable {
    static T: OnceLock<GridTable> = OnceLock::new();
    T.get_or_init(|| GridTable::build(levels_of(&IQ2S_GRID, &IQ2_MAP), 2, 3, 1))
}

/// IQ1_S and IQ1_M share one table (values -1, 0, 1 are levels 0, 1, 2).
pub fn iq1() -> &'static GridTable {
    static T: OnceLock<GridTable> = OnceLock::new();
    T.get_or_init(|| {
        let levels = IQ1S_GRID
            .iter()
            .map(|g| g.iter().map(|&v| (v + 1) as u8).collect())
            .collect();
        GridTable::build(levels, 2, 3, 3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist2(a: &[i8], b: &[i32]) -> i32 {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| (x as i32 - y) * (x as i32 - y))
            .sum()
    }

    /// Every point maps to itself; every other key the quantizers can
    /// form has candidates ordered by distance then index, starting with
    /// every point at the least distance.
    fn check(t: &GridTable, bits: usize, n_levels: usize, n_points: usize) {
        for k in 0..n_points {
            let u = t.point(k).iter().enumerate().fold(0usize, |u, (i, &v)| {
                u | (((v - 1) / 2) as usize) << (bits * i)
            });
            assert!(matches!(t.lookup(u), Lookup::OnGrid(j) if j == k));
        }
        let mask = (1usize << bits) - 1;
        let mut off_grid = 0;
        for u in 0..1usize << (bits * t.dim) {
            if (0..t.dim).any(|i| (u >> (bits * i)) & mask >= n_levels) {
                continue;
            }
            let Lookup::Near(near) = t.lookup(u) else {
                continue;
            };
            off_grid += 1;
            let pos: Vec<i32> = (0..t.dim)
                .map(|i| 2 * ((u >> (bits * i)) & mask) as i32 + 1)
                .collect();
            let d: Vec<(i32, u16)> = near
                .iter()
                .map(|&j| (dist2(t.point(j as usize), &pos), j))
                .collect();
            assert!(!d.is_empty() && d.windows(2).all(|w| w[0] < w[1]));
            let least = (0..n_points)
                .map(|j| dist2(t.point(j), &pos))
                .min()
                .unwrap();
            let n_least = (0..n_points)
                .filter(|&j| dist2(t.point(j), &pos) == least)
                .count();
            assert_eq!(d[0].0, least);
            assert_eq!(d.iter().filter(|x| x.0 == least).count(), n_least);
        }
        assert!(off_grid > 0);
    }

    #[test]
    fn iq3_tables_hold_every_point_and_nearest_neighbours() {
        check(iq3xxs(), 3, 8, 256);
        check(iq3s(), 3, 8, 512);
    }

    #[test]
    fn iq2_and_iq1_tables_hold_every_point_and_nearest_neighbours() {
        check(iq2xxs(), 2, 3, 256);
        check(iq2xs(), 2, 3, 512);
        check(iq2s(), 2, 3, 1024);
        check(iq1(), 2, 3, 2048);
    }
}
