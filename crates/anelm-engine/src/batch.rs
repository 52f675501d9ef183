//! `Batch`: lanes × channels of f32 activations on the host, the unit every kernel consumes.

/// Activations of several lanes (sessions, or consecutive prompt tokens), lane-major:
/// element (lane, channel) sits at `lane * channels + channel`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    lanes: usize,
    channels: usize,
    data: Vec<f32>,
}

/// Lanes per kernel-pool task of [`Batch::par_lanes_mut`].
const LANES_PER_TASK: usize = 8;

impl Batch {
    /// `f(lane, values)` for every lane, the lanes split across the kernel pool: the per-lane
    /// host work of a prefill (norms, RoPE, activations) over hundreds of lanes, which would
    /// otherwise run on the calling thread while the pool's workers wait.
    pub fn par_lanes_mut(&mut self, f: &(dyn Fn(usize, &mut [f32]) + Sync)) {
        let width = self.channels();
        if width == 0 {
            return;
        }
        anelm_kernels::pool::global().for_each_chunk_mut(self.as_mut_slice(), width * LANES_PER_TASK, &|t, chunk| {
            for (i, lane) in chunk.chunks_exact_mut(width).enumerate() {
                f(t * LANES_PER_TASK + i, lane);
            }
        });
    }

    /// A zeroed batch.
    pub fn zeros(lanes: usize, channels: usize) -> Self {
        Self {
            lanes,
            channels,
            data: vec![0.0; lanes * channels],
        }
    }

    /// Wrap lane-major data; `None` if the length does not match.
    pub fn from_vec(lanes: usize, channels: usize, data: Vec<f32>) -> Option<Self> {
        (data.len() == lanes * channels).then_some(Self { lanes, channels, data })
    }

    /// Reshape in place, reusing the allocation (contents are unspecified afterwards).
    pub fn resize(&mut self, lanes: usize, channels: usize) {
        self.lanes = lanes;
        self.channels = channels;
        self.data.resize(lanes * channels, 0.0);
    }

    /// Number of lanes.
    pub fn lanes(&self) -> usize {
        self.lanes
    }

    /// Channels per lane.
    pub fn channels(&self) -> usize {
        self.channels
    }

    /// All values, lane-major.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// All values, lane-major, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// One lane's channels.
    pub fn lane(&self, lane: usize) -> &[f32] {
        &self.data[lane * self.channels..(lane + 1) * self.channels]
    }

    /// One lane's channels, mutable.
    pub fn lane_mut(&mut self, lane: usize) -> &mut [f32] {
        &mut self.data[lane * self.channels..(lane + 1) * self.channels]
    }
}
