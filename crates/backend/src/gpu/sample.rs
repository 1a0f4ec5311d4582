//! Sampling where the logits are (`kernels/cuda/sample.cu`): the rows' parameters and penalty
//! pairs go up, one token per row comes back.

use super::{Buffer, Element, GpuActivations, GpuBackend, KernelArg, Runtime, int};
use crate::{Error, RowSampling};

/// Threads per block of `sample_rows` (`SAMPLE_THREADS`), one block per row.
const SAMPLE_THREADS: u32 = 1024;
/// The token `sample_rows` gives a row whose candidates it could not hold (`SAMPLE_ON_HOST`).
const SAMPLE_ON_HOST: u32 = u32::MAX;
/// The largest vocabulary whose fixed-point probabilities (2^45 for the most likely token) the
/// kernel can add in 64 bits.
pub(crate) const MAX_SAMPLED_VOCAB: usize = 1 << 18;

/// A row's sampling as the kernel's `SampleRow` lays it out.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub(crate) struct DeviceSampleRow {
    row: u32,
    top_k: u32,
    inv_temperature: f32,
    top_p: f32,
    min_p: f32,
    repetition: f32,
    presence: f32,
    frequency: f32,
    penalties_from: u32,
    penalties_to: u32,
    uniform: f64,
}
const _: () = assert!(size_of::<DeviceSampleRow>() == 48);

// SAFETY: `repr(C)` with ten 4-byte fields then an 8-byte one at offset 40: no padding (the
// assertion above), and every bit pattern of its numbers is a value.
unsafe impl Element for DeviceSampleRow {}

impl DeviceSampleRow {
    fn of(s: &RowSampling) -> Self {
        Self {
            row: s.row as u32,
            // Beyond any vocabulary the kernel takes, top-k keeps all, as 0 does.
            top_k: s.top_k.min(u32::MAX as usize) as u32,
            // As the host's sampler scales: by the reciprocal, computed in f32.
            inv_temperature: if s.temperature == 0.0 {
                0.0
            } else {
                1.0 / s.temperature
            },
            top_p: s.top_p,
            min_p: s.min_p,
            repetition: s.repetition_penalty,
            presence: s.presence_penalty,
            frequency: s.frequency_penalty,
            penalties_from: s.penalised.start as u32,
            penalties_to: s.penalised.end as u32,
            uniform: s.uniform,
        }
    }
}

/// The buffers of [`Backend::sample_rows`](crate::Backend::sample_rows), on the device and
/// their host sides, grown to the most asked for, so that a warm step allocates nothing.
pub(crate) struct SampleBuffers<R: Runtime> {
    rows: Option<Buffer<R, DeviceSampleRow>>,
    penalties: Option<Buffer<R, u32>>,
    tokens: Option<Buffer<R, u32>>,
    host_rows: Vec<DeviceSampleRow>,
    host_penalties: Vec<u32>,
    host_tokens: Vec<u32>,
}

impl<R: Runtime> SampleBuffers<R> {
    pub(crate) fn new() -> Self {
        Self {
            rows: None,
            penalties: None,
            tokens: None,
            host_rows: Vec::new(),
            host_penalties: Vec::new(),
            host_tokens: Vec::new(),
        }
    }
}

/// `slot`'s buffer if it holds `len` values, else a new one (zeroed).
pub(super) fn at_least<'a, R: Runtime, T: Element>(
    backend: &GpuBackend<R>,
    slot: &'a mut Option<Buffer<R, T>>,
    len: usize,
    what: &'static str,
) -> Result<&'a mut Buffer<R, T>, Error> {
    if slot.as_ref().is_some_and(|b| b.len >= len) {
        return Ok(slot.as_mut().expect("checked above"));
    }
    Ok(slot.insert(backend.zeros(len, what)?))
}

/// The checks of `sample_rows`' arguments against the logits' shape.
pub(crate) fn check(
    logits_rows: usize,
    vocab: usize,
    rows: &[RowSampling],
    penalised: &[(u32, u32)],
    out: usize,
) -> Result<(), Error> {
    let bad = |detail: String| {
        Err(Error::Shape {
            op: "sample_rows",
            detail,
        })
    };
    if out != rows.len() {
        return bad(format!(
            "{} rows to sample, {out} tokens to write",
            rows.len()
        ));
    }
    if vocab > MAX_SAMPLED_VOCAB {
        return bad(format!(
            "a vocabulary of {vocab} tokens is above the {MAX_SAMPLED_VOCAB} the device's sampler \
             takes"
        ));
    }
    if penalised.len() > u32::MAX as usize / 2 {
        return bad(format!("{} penalised tokens", penalised.len()));
    }
    for (i, s) in rows.iter().enumerate() {
        if s.row >= logits_rows {
            return bad(format!("entry {i} samples row {} of {logits_rows}", s.row));
        }
        if s.penalised.start > s.penalised.end || s.penalised.end > penalised.len() {
            return bad(format!(
                "entry {i}'s penalised tokens {:?} are not within the {} given",
                s.penalised,
                penalised.len()
            ));
        }
        if !(0.0..1.0).contains(&s.uniform) {
            return bad(format!(
                "entry {i}'s uniform number {} is not in [0, 1)",
                s.uniform
            ));
        }
    }
    Ok(())
}

impl<R: Runtime> GpuBackend<R> {
    /// [`Backend::sample_rows`](crate::Backend::sample_rows).
    pub(super) fn sample_on_device(
        &self,
        x: &mut GpuActivations<R>,
        rows: &[RowSampling],
        penalised: &[(u32, u32)],
        out: &mut [Option<u32>],
    ) -> Result<(), Error> {
        check(x.rows, x.cols, rows, penalised, out.len())?;
        if rows.is_empty() {
            return Ok(());
        }
        let mut guard = self.sampling.lock().unwrap_or_else(|e| e.into_inner());
        let buffers = &mut *guard;
        buffers.host_rows.clear();
        buffers
            .host_rows
            .extend(rows.iter().map(DeviceSampleRow::of));
        buffers.host_penalties.clear();
        buffers
            .host_penalties
            .extend(penalised.iter().flat_map(|&(t, n)| [t, n]));
        let device_rows = at_least(self, &mut buffers.rows, rows.len(), "sampling rows")?;
        self.upload(&buffers.host_rows, device_rows)?;
        let rows_arg = device_rows.arg();
        let pairs = buffers.host_penalties.len();
        let device_pairs = at_least(self, &mut buffers.penalties, pairs, "penalties")?;
        self.upload(&buffers.host_penalties, device_pairs)?;
        let pairs_arg = device_pairs.arg();
        let tokens = at_least(self, &mut buffers.tokens, rows.len(), "sampled tokens")?;
        let args: [KernelArg; 5] = [x.written(), int(x.cols), rows_arg, pairs_arg, tokens.arg()];
        self.launch(
            "sample_rows",
            &self.kernels.sample_rows,
            rows.len() as u32,
            SAMPLE_THREADS,
            &args,
        )?;
        buffers.host_tokens.resize(rows.len(), 0);
        self.download("sample_rows", tokens, &mut buffers.host_tokens)?;
        for (slot, &token) in out.iter_mut().zip(&buffers.host_tokens) {
            *slot = (token != SAMPLE_ON_HOST).then_some(token);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(row: usize) -> RowSampling {
        RowSampling {
            row,
            temperature: 0.7,
            top_k: 0,
            top_p: 0.9,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalised: 0..0,
            uniform: 0.5,
        }
    }

    #[test]
    fn rows_penalties_and_uniforms_out_of_range_are_errors() {
        assert!(check(2, 100, &[row(0), row(1)], &[], 2).is_ok());
        for (rows, pairs, out, why) in [
            (vec![row(2)], vec![], 1, "row"),
            (vec![row(0)], vec![], 2, "tokens to write"),
            (
                vec![RowSampling {
                    penalised: 1..3,
                    ..row(0)
                }],
                vec![(5, 1)],
                1,
                "penalised",
            ),
            (
                vec![RowSampling {
                    uniform: 1.0,
                    ..row(0)
                }],
                vec![],
                1,
                "uniform",
            ),
        ] {
            let err = check(2, 100, &rows, &pairs, out).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
        let err = check(1, MAX_SAMPLED_VOCAB + 1, &[row(0)], &[], 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("vocabulary"), "{err}");
    }

    #[test]
    fn the_kernel_scales_by_the_hosts_reciprocal_and_greedy_by_zero() {
        assert_eq!(DeviceSampleRow::of(&row(0)).inv_temperature, 1.0 / 0.7f32);
        let greedy = RowSampling {
            temperature: 0.0,
            ..row(0)
        };
        assert_eq!(DeviceSampleRow::of(&greedy).inv_temperature, 0.0);
    }
}
