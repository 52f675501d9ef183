//! Running one kernel's loaded programs over many lanes: the lanes are grouped into dispatches of
//! at most [`LANES`], each group packed into fp16 surfaces, evaluated and unpacked, and the
//! programs combined as their [`ProgramLayout`] says (row chunks concatenated, a residual input,
//! the residual added on the host, or FFN chunks accumulating over the packed `x ‖ acc` input).
//! The engine's ANE backend is an adapter from its batches to this.

use std::time::Duration;

use thiserror::Error;

use crate::device::{AneDevice, ProgramHandle};
use crate::error::{AneError, SurfaceError};
use crate::kernel::AneKernel;
use crate::surface::{LANES, Surface};
use crate::surface_pool;

/// One loaded program of a kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedProgram {
    /// The device's handle.
    pub handle: ProgramHandle,
    /// What it computes.
    pub kernel: AneKernel,
    /// Output channels.
    pub outputs: usize,
    /// Weight bytes one dispatch streams (in the mode it was built in).
    pub weight_bytes: u64,
}

/// How a kernel's programs combine.
#[derive(Debug, Clone, PartialEq)]
pub enum ProgramLayout {
    /// `x` → every program; outputs concatenated in order (row chunks, or one fused linear).
    Rows(Vec<LoadedProgram>),
    /// `(x, r)` → one program with inputs x and r.
    Residual(LoadedProgram),
    /// `(x, r)` → one program on x; r added on the host (the plain FFN fallback).
    AddOnHost(LoadedProgram),
    /// `(x, r)` → accumulating FFN chunks over the packed input `x ‖ acc`, acc starting at r.
    Chunks(Vec<LoadedProgram>),
}

/// What one run cost, summed over its dispatches.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RunCost {
    /// Dispatches made.
    pub dispatches: u64,
    /// Bytes the device says the dispatches moved (weights and surfaces).
    pub bytes: u64,
    /// Weight bytes streamed.
    pub weight_bytes: u64,
    /// Neural Engine time (modelled by the emulator, measured on a Mac).
    pub ane: Duration,
}

impl RunCost {
    /// Surface bytes moved (all bytes but the weights).
    pub fn activation_bytes(&self) -> u64 {
        self.bytes.saturating_sub(self.weight_bytes)
    }
}

/// A run that could not complete.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum RunError {
    /// The device refused an evaluation.
    #[error("{kernel}: {source}")]
    Device {
        /// The program's kernel.
        kernel: String,
        /// The device's error.
        source: AneError,
    },
    /// A surface could not be packed.
    #[error("{0}")]
    Surface(#[from] SurfaceError),
    /// The inputs do not fit the layout.
    #[error("{0}")]
    Shape(String),
}

impl ProgramLayout {
    /// The programs, in dispatch order.
    pub fn programs(&self) -> &[LoadedProgram] {
        match self {
            ProgramLayout::Rows(p) | ProgramLayout::Chunks(p) => p,
            ProgramLayout::Residual(p) | ProgramLayout::AddOnHost(p) => std::slice::from_ref(p),
        }
    }

    /// Whether a run takes the residual `r` besides `x`.
    pub fn takes_residual(&self) -> bool {
        !matches!(self, ProgramLayout::Rows(_))
    }

    /// Run over `lanes` lanes: `x` is lanes × `input` and `r` (when the layout takes it) and `out`
    /// are lanes × `output`, all lane-major f32.
    #[allow(clippy::too_many_arguments)]
    pub fn run<D: AneDevice + ?Sized>(
        &self,
        device: &D,
        input: usize,
        output: usize,
        lanes: usize,
        x: &[f32],
        r: Option<&[f32]>,
        out: &mut [f32],
    ) -> Result<RunCost, RunError> {
        if x.len() != lanes * input || out.len() != lanes * output {
            return Err(RunError::Shape(format!(
                "{} inputs and {} outputs for {lanes} lanes of {input} → {output}",
                x.len(),
                out.len()
            )));
        }
        let r = match (self.takes_residual(), r) {
            (false, _) => None,
            (true, Some(r)) if r.len() == lanes * output => Some(r),
            (true, Some(r)) => {
                return Err(RunError::Shape(format!(
                    "residual of {} values, expected {lanes} lanes of {output}",
                    r.len()
                )));
            }
            (true, None) => return Err(RunError::Shape("residual kernel run without r".into())),
        };
        let mut cost = RunCost::default();
        for start in (0..lanes).step_by(LANES) {
            let n = LANES.min(lanes - start);
            let mut xs = surface_pool::take(input);
            xs.pack(x, input, start, n)?;
            match (self, r) {
                (ProgramLayout::Rows(programs), _) if programs.len() > 1 => {
                    rows_pipelined(device, programs, &xs.surface, out, output, start, n, &mut cost)?;
                }
                (ProgramLayout::Rows(programs), _) => {
                    let mut offset = 0;
                    for p in programs {
                        let y = eval(device, p, &[&xs.surface], &mut cost)?;
                        unpack(&y.surface, out, output, start, n, offset);
                        offset += p.outputs;
                        surface_pool::give(y);
                    }
                }
                (ProgramLayout::Residual(p), Some(r)) => {
                    let mut rs = surface_pool::take(output);
                    rs.pack(r, output, start, n)?;
                    let y = eval(device, p, &[&xs.surface, &rs.surface], &mut cost)?;
                    unpack(&y.surface, out, output, start, n, 0);
                    surface_pool::give(rs);
                    surface_pool::give(y);
                }
                (ProgramLayout::AddOnHost(p), Some(r)) => {
                    let y = eval(device, p, &[&xs.surface], &mut cost)?;
                    unpack(&y.surface, out, output, start, n, 0);
                    surface_pool::give(y);
                    let span = start * output..(start + n) * output;
                    for (o, &add) in out[span.clone()].iter_mut().zip(&r[span]) {
                        *o += add;
                    }
                }
                (ProgramLayout::Chunks(programs), Some(r)) => {
                    let mut packed = surface_pool::take_output(2 * input);
                    packed.surface.copy_channels_from(0, &xs.surface)?;
                    let mut acc = surface_pool::take(output);
                    acc.pack(r, output, start, n)?;
                    for p in programs {
                        packed.surface.copy_channels_from(input, &acc.surface)?;
                        surface_pool::give(std::mem::replace(
                            &mut acc,
                            eval(device, p, &[&packed.surface], &mut cost)?,
                        ));
                    }
                    unpack(&acc.surface, out, output, start, n, 0);
                    surface_pool::give(packed);
                    surface_pool::give(acc);
                }
                (_, None) => return Err(RunError::Shape("residual kernel run without r".into())),
            }
            surface_pool::give(xs);
        }
        Ok(cost)
    }
}

/// A row-chunked kernel (the LM head's chunks, a split projection): a helper thread evaluates
/// the chunks one after another while this thread unpacks each finished chunk, so the host's
/// unpacking of chunk k overlaps the device's run of chunk k + 1 and only the last chunk's
/// unpacking stays on the critical path (issue 38).
#[allow(clippy::too_many_arguments)]
fn rows_pipelined<D: AneDevice + ?Sized>(
    device: &D,
    programs: &[LoadedProgram],
    xs: &Surface,
    out: &mut [f32],
    output: usize,
    start: usize,
    n: usize,
    cost: &mut RunCost,
) -> Result<(), RunError> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<(usize, surface_pool::Pooled)>(1);
    std::thread::scope(|scope| {
        let worker = scope.spawn(move || {
            let mut offset = 0;
            for p in programs {
                let y = eval(device, p, &[xs], cost)?;
                if tx.send((offset, y)).is_err() {
                    break;
                }
                offset += p.outputs;
            }
            Ok::<(), RunError>(())
        });
        for (offset, y) in rx.iter() {
            unpack(&y.surface, out, output, start, n, offset);
            surface_pool::give(y);
        }
        worker
            .join()
            .map_err(|_| RunError::Shape("the chunk-evaluating thread panicked".into()))?
    })
}

fn eval<D: AneDevice + ?Sized>(
    device: &D,
    p: &LoadedProgram,
    inputs: &[&Surface],
    cost: &mut RunCost,
) -> Result<surface_pool::Pooled, RunError> {
    let mut out = surface_pool::take_output(p.outputs);
    let t = device
        .evaluate(p.handle, inputs, std::slice::from_mut(&mut out.surface))
        .map_err(|source| RunError::Device {
            kernel: p.kernel.to_string(),
            source,
        })?;
    cost.dispatches += 1;
    cost.bytes += t.bytes;
    cost.weight_bytes += p.weight_bytes;
    cost.ane += t.ane;
    Ok(out)
}

/// Channels of `s` into lanes `start..start + n` of the lane-major `out` (`width` per lane) at
/// channel `offset`.
fn unpack(s: &Surface, out: &mut [f32], width: usize, start: usize, n: usize, offset: usize) {
    let w = s.lanes();
    let halves = s.halves();
    for j in 0..n {
        let lane = start + j;
        let dst = &mut out[lane * width + offset..lane * width + offset + s.channels()];
        for (c, y) in dst.iter_mut().enumerate() {
            *y = halves[c * w + j].to_f32();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::compile_and_load;
    use crate::emu::EmuAne;
    use crate::kernel::WeightMode;
    use crate::lower::lower;

    fn load(ane: &EmuAne, kernel: AneKernel, w: &[&[f32]]) -> LoadedProgram {
        let low = lower(&kernel, w, WeightMode::Fp16).unwrap();
        LoadedProgram {
            handle: compile_and_load(ane, &low.mil_text(), &low.weights).unwrap(),
            outputs: kernel.output_channels(),
            weight_bytes: kernel.weight_bytes(WeightMode::Fp16) as u64,
            kernel,
        }
    }

    /// Two row chunks over 40 lanes (two dispatch groups), then the same rows with the residual
    /// added on the host: both equal the f32 reference within fp16 rounding.
    #[test]
    fn row_chunks_and_host_residual_match_the_reference_across_lane_groups() {
        let ane = EmuAne::default();
        let (rows, cols, lanes) = (6, 4, 40);
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 5) % 7) as f32 / 8.0 - 0.3).collect();
        let x: Vec<f32> = (0..lanes * cols).map(|i| ((i * 3) % 11) as f32 / 16.0 - 0.25).collect();
        let r: Vec<f32> = (0..lanes * rows).map(|i| (i % 5) as f32 / 4.0).collect();
        let want: Vec<f32> = (0..lanes)
            .flat_map(|l| {
                let (w, x) = (&w, &x);
                (0..rows).map(move |o| (0..cols).map(|c| w[o * cols + c] * x[l * cols + c]).sum::<f32>())
            })
            .collect();
        let top = load(&ane, AneKernel::Linear { rows: 4, cols }, &[&w[..4 * cols]]);
        let bottom = load(&ane, AneKernel::Linear { rows: 2, cols }, &[&w[4 * cols..]]);
        let rows_layout = ProgramLayout::Rows(vec![top, bottom]);
        let mut out = vec![0.0; lanes * rows];
        let cost = rows_layout.run(&ane, cols, rows, lanes, &x, None, &mut out).unwrap();
        assert_eq!(cost.dispatches, 4);
        assert!(out.iter().zip(&want).all(|(a, b)| (a - b).abs() < 2e-3), "{out:?}");

        let whole = load(&ane, AneKernel::Linear { rows, cols }, &[&w]);
        let host = ProgramLayout::AddOnHost(whole);
        host.run(&ane, cols, rows, lanes, &x, Some(&r), &mut out).unwrap();
        assert!(
            out.iter()
                .zip(want.iter().zip(&r))
                .all(|(a, (b, c))| (a - b - c).abs() < 4e-3)
        );
        assert!(matches!(
            host.run(&ane, cols, rows, lanes, &x, None, &mut out),
            Err(RunError::Shape(_))
        ));
        assert!(matches!(
            rows_layout.run(&ane, cols, rows, lanes, &x[1..], None, &mut out),
            Err(RunError::Shape(_))
        ));
    }
}
