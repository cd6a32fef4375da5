//! What a recurrent (Mamba-2) session carries instead of keys and values,
//! and a hybrid's beside them: per recurrent layer, the last `d_conv - 1`
//! inputs of the causal convolution and the SSM state. Attention layers
//! keep none: each recurrent layer has a slot, in layer order. A state
//! cannot be cut back to an earlier position the way a KV cache can, so the
//! session keeps copies (checkpoints) at the positions it may have to
//! return to: the start of every eval, and every token of an exact-rows
//! eval (speculative verification).

use std::collections::VecDeque;
use std::sync::Arc;

use super::config::SsmConfig;
use crate::{Error, Result};

#[derive(Clone, PartialEq)]
pub struct RecurrentState {
    pub shape: SsmConfig,
    /// Each layer's slot, `None` for a layer without a state (shared by
    /// every copy: checkpoints clone it).
    slots: Arc<[Option<usize>]>,
    n_slots: usize,
    /// `n_slots x conv_dim x (d_conv - 1)`, oldest input first.
    pub conv: Vec<f32>,
    /// `n_slots x n_head x head_dim x d_state`.
    pub ssm: Vec<f32>,
}

impl RecurrentState {
    /// A zero state for the layers whose `recr_layers` flag is set.
    pub fn new(shape: SsmConfig, recr_layers: &[bool]) -> Result<Self> {
        let mut n_slots = 0;
        let slots: Arc<[Option<usize>]> = recr_layers
            .iter()
            .map(|&r| {
                r.then(|| {
                    n_slots += 1;
                    n_slots - 1
                })
            })
            .collect();
        let conv = n_slots.checked_mul(shape.conv_len());
        let ssm = n_slots.checked_mul(shape.ssm_len());
        match (conv, ssm) {
            (Some(c), Some(s)) => Ok(RecurrentState {
                shape,
                slots,
                n_slots,
                conv: vec![0.0; c],
                ssm: vec![0.0; s],
            }),
            _ => Err(Error::invalid("the recurrent state does not fit in memory")),
        }
    }

    /// Layers that carry a state.
    pub fn n_slots(&self) -> usize {
        self.n_slots
    }

    pub fn clear(&mut self) {
        self.conv.fill(0.0);
        self.ssm.fill(0.0);
    }

    /// Layer `il`'s convolution and SSM state (`None` for a layer that
    /// keeps none).
    pub fn layer_mut(&mut self, il: usize) -> Option<(&mut [f32], &mut [f32])> {
        let slot = self.slots.get(il).copied().flatten()?;
        let (c, s) = (self.shape.conv_len(), self.shape.ssm_len());
        Some((
            &mut self.conv[slot * c..(slot + 1) * c],
            &mut self.ssm[slot * s..(slot + 1) * s],
        ))
    }

    /// Bytes of `export`: both states as little-endian f32.
    pub fn export_len(&self) -> usize {
        (self.conv.len() + self.ssm.len()) * 4
    }

    pub fn export_into(&self, out: &mut [u8]) -> Result<()> {
        if out.len() != self.export_len() {
            return Err(Error::invalid(format!(
                "recurrent state export needs {} bytes, got a buffer of {}",
                self.export_len(),
                out.len()
            )));
        }
        for (o, v) in out
            .chunks_exact_mut(4)
            .zip(self.conv.iter().chain(&self.ssm))
        {
            o.copy_from_slice(&v.to_le_bytes());
        }
        Ok(())
    }

    /// Replaces the state with exported bytes, checked for length and for
    /// finite values before anything changes.
    pub fn import(&mut self, data: &[u8]) -> Result<()> {
        if data.len() != self.export_len() {
            return Err(Error::invalid(format!(
                "recurrent state data has {} bytes, this model's state has {} \
                 ({} recurrent layers of {} bytes)",
                data.len(),
                self.export_len(),
                self.n_slots,
                self.export_len() / self.n_slots.max(1)
            )));
        }
        let vals: Vec<f32> = data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if vals.iter().any(|v| !v.is_finite()) {
            return Err(Error::invalid(
                "recurrent state data holds a non-finite value",
            ));
        }
        let (c, s) = vals.split_at(self.conv.len());
        self.conv.copy_from_slice(c);
        self.ssm.copy_from_slice(s);
        Ok(())
    }
}

/// Bytes of checkpoints one session may keep.
const CHECKPOINT_BUDGET: usize = 256 << 20;

/// A recurrent session's state and the checkpoints it can roll back to.
#[derive(Clone)]
pub struct Recurrent {
    pub state: RecurrentState,
    /// `(position, state at that position)`, oldest first.
    checkpoints: VecDeque<(usize, RecurrentState)>,
    /// Most checkpoints kept; the oldest go first.
    pub max_checkpoints: usize,
}

impl Recurrent {
    pub fn new(shape: SsmConfig, recr_layers: &[bool]) -> Result<Self> {
        let state = RecurrentState::new(shape, recr_layers)?;
        // Enough for a speculative round of 32 drafts, within a memory
        // budget: a large model's state is hundreds of MB, and rewinding
        // further than the kept positions evaluates tokens again instead.
        let fit = CHECKPOINT_BUDGET / state.export_len().max(1);
        Ok(Recurrent {
            state,
            checkpoints: VecDeque::new(),
            max_checkpoints: fit.clamp(2, 40),
        })
    }

    /// Remembers the current state as the state at position `pos`.
    pub fn checkpoint(&mut self, pos: usize) {
        if pos == 0 || self.max_checkpoints == 0 {
            return;
        }
        self.checkpoints.retain(|(p, _)| *p != pos);
        if self.checkpoints.len() >= self.max_checkpoints {
            self.checkpoints.pop_front();
        }
        self.checkpoints.push_back((pos, self.state.clone()));
    }

    /// Positions the state can return to (besides 0 and the current one).
    pub fn checkpoint_positions(&self) -> Vec<usize> {
        self.checkpoints.iter().map(|(p, _)| *p).collect()
    }

    /// Whether `rollback(n_past, n)` would succeed.
    pub fn can_rollback(&self, n_past: usize, n: usize) -> bool {
        n == 0 || n == n_past || self.checkpoints.iter().any(|(p, _)| *p == n)
    }

    /// The state at position `n` (from `n_past`); checkpoints past `n` go.
    pub fn rollback(&mut self, n_past: usize, n: usize) -> Result<()> {
        if n == n_past {
            return Ok(());
        }
        if n == 0 {
            self.state.clear();
            self.checkpoints.clear();
            return Ok(());
        }
        let Some(i) = self.checkpoints.iter().position(|(p, _)| *p == n) else {
            return Err(Error::invalid(format!(
                "cannot roll a recurrent (state-space) model back from position {n_past} to {n}: \
                 it keeps its state only at positions {:?} (and 0); evaluate again from a kept position",
                self.checkpoint_positions()
            )));
        };
        self.state = self.checkpoints[i].1.clone();
        self.checkpoints.truncate(i + 1);
        Ok(())
    }

    /// A copy holding the state at position `n` (which must be reachable).
    pub fn fork(&self, n_past: usize, n: usize) -> Result<Recurrent> {
        let mut r = self.clone();
        r.rollback(n_past, n)?;
        Ok(r)
    }

    /// The state was replaced wholesale (import): old checkpoints no
    /// longer belong to it.
    pub fn forget_checkpoints(&mut self) {
        self.checkpoints.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> SsmConfig {
        SsmConfig {
            d_conv: 3,
            d_inner: 4,
            d_state: 2,
            n_group: 0,
            n_head: 4,
        }
    }

    #[test]
    fn only_recurrent_layers_keep_a_state_in_layer_order() {
        let mut st = RecurrentState::new(shape(), &[false, true, false, true]).unwrap();
        assert_eq!(st.n_slots(), 2);
        assert_eq!(st.export_len(), 2 * (2 * 4 + 4 * 2) * 4);
        assert!(st.layer_mut(0).is_none() && st.layer_mut(2).is_none());
        assert!(st.layer_mut(4).is_none());
        let (c, s) = st.layer_mut(3).unwrap();
        c.fill(3.0);
        s.fill(-3.0);
        // Layer 3 is the second slot: its convolution state follows layer
        // 1's, and its SSM state ends the buffer.
        assert_eq!(&st.conv[..8], &[0.0; 8]);
        assert_eq!(&st.conv[8..], &[3.0; 8]);
        assert_eq!(&st.ssm[8..], &[-3.0; 8]);
        let mut out = vec![0u8; st.export_len()];
        st.export_into(&mut out).unwrap();
        let mut back = RecurrentState::new(shape(), &[false, true, false, true]).unwrap();
        back.import(&out).unwrap();
        assert!(back == st);
        // Another layout's bytes are refused, naming both sizes.
        let mut every = RecurrentState::new(shape(), &[true; 4]).unwrap();
        let err = every.import(&out).unwrap_err().to_string();
        assert!(err.contains("128 bytes") && err.contains("256"), "{err}");
    }
}
