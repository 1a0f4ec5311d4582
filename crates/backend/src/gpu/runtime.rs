//! What a GPU runtime gives the backend: device memory, copies, kernel launches on one stream,
//! and recording a stream's work as a graph. The CUDA driver API and HIP's module API offer the
//! same operations under different names, so [`GpuBackend`](super::GpuBackend) runs on either.

use std::ffi::c_void;

/// A GPU runtime on one device, every operation queued on its one stream in issue order.
///
/// Implemented by [`Cuda`](crate::Cuda) and [`Hip`](crate::Hip); sealed, since the backend's
/// safety rests on every implementation keeping these contracts.
pub trait Runtime: Send + Sync + Sized + sealed::Sealed + 'static {
    /// The backend's name in messages (`cuda`, `hip`).
    const NAME: &'static str;
    /// The environment variable that turns graph recording off when set to `0`.
    const GRAPHS_VAR: &'static str;
    /// The environment variable that, set to `0`, leaves sampling to the host (the logits
    /// copied back), to compare.
    const SAMPLING_VAR: &'static str;
    /// The environment variable naming launches to leave out, to measure what each costs in
    /// a pass as it runs (graphs, overlapped launches, full clocks), where a profiler would
    /// serialise them: see [`SkippedLaunches`](super::SkippedLaunches). The outputs are wrong.
    const SKIP_VAR: &'static str;
    /// Device memory, freed when dropped.
    type Buffer: Send + Sync;
    /// A loaded kernel.
    type Function: Send + Sync;
    /// A recorded, instantiated graph.
    type Graph: Send;

    /// `bytes` (at least one) of zeroed device memory.
    fn alloc_zeroed(&self, bytes: usize) -> Result<Self::Buffer, String>;
    /// The device address of `buffer`, as the kernels take it.
    fn address(&self, buffer: &Self::Buffer) -> u64;
    /// Copies `src` to the start of `dst`, which holds at least `src.len()` bytes. `src` may be
    /// reused once this returns.
    fn upload(&self, dst: &mut Self::Buffer, src: &[u8]) -> Result<(), String>;
    /// Copies the start of `src` to `dst` once the work queued before has run.
    fn download(&self, src: &Self::Buffer, dst: &mut [u8]) -> Result<(), String>;
    /// Returns once the work queued so far has run.
    fn synchronize(&self) -> Result<(), String>;
    /// Queues `function` over `grid` blocks of `block` threads, each given `shared_bytes` of
    /// dynamic shared memory. With `overlap`, where the device can, the kernel may start
    /// before the one queued before it has finished: every kernel waits for its predecessor
    /// before touching what it wrote (kernels/portable.cuh).
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in number, order and type, and every address
    /// and size among them must keep the kernel's accesses inside live buffers; a kernel that
    /// takes dynamic shared memory must be given what it uses.
    unsafe fn launch(
        &self,
        function: &Self::Function,
        grid: u32,
        block: u32,
        shared_bytes: u32,
        args: &[KernelArg],
        overlap: bool,
    ) -> Result<(), String>;
    /// Lets launches of `function` take `bytes` of dynamic shared memory, where the device
    /// asks kernels to opt in beyond a default.
    fn allow_shared(&self, function: &Self::Function, bytes: u32) -> Result<(), String>;
    /// The most threads a block of `function` may have on this device, as its registers and
    /// shared memory allow.
    fn max_block_threads(&self, function: &Self::Function) -> Result<u32, String>;
    /// Starts recording the stream's work instead of running it.
    fn begin_recording(&self) -> Result<(), String>;
    /// Stops recording; the graph of what was queued since [`begin_recording`], `None` if
    /// nothing was.
    ///
    /// [`begin_recording`]: Runtime::begin_recording
    fn end_recording(&self) -> Result<Option<Self::Graph>, String>;
    /// Queues a recorded graph.
    fn replay(&self, graph: &Self::Graph) -> Result<(), String>;
}

mod sealed {
    pub trait Sealed {}
}
pub(crate) use sealed::Sealed;

/// One kernel argument, passed by value. Device addresses are `u64` on both runtimes.
#[derive(Clone, Copy, Debug)]
pub enum KernelArg {
    /// A device address (`T*`), or a `u64`/`unsigned long long`.
    U64(u64),
    /// An `int`.
    I32(i32),
    /// A `long long`.
    I64(i64),
    /// A `float`.
    F32(f32),
    /// The kernels' `QuantizedOut` (kernels/cuda/q8.cuh): four device addresses.
    Quantized(QuantizedOut),
}

impl KernelArg {
    /// The address of the value, as the runtimes' launch calls take each parameter.
    pub(crate) fn as_ptr(&self) -> *mut c_void {
        match self {
            KernelArg::U64(v) => std::ptr::from_ref(v).cast_mut().cast(),
            KernelArg::I32(v) => std::ptr::from_ref(v).cast_mut().cast(),
            KernelArg::I64(v) => std::ptr::from_ref(v).cast_mut().cast(),
            KernelArg::F32(v) => std::ptr::from_ref(v).cast_mut().cast(),
            KernelArg::Quantized(v) => std::ptr::from_ref(v).cast_mut().cast(),
        }
    }
}

impl From<i32> for KernelArg {
    fn from(v: i32) -> Self {
        KernelArg::I32(v)
    }
}

impl From<i64> for KernelArg {
    fn from(v: i64) -> Self {
        KernelArg::I64(v)
    }
}

impl From<u64> for KernelArg {
    fn from(v: u64) -> Self {
        KernelArg::U64(v)
    }
}

impl From<f32> for KernelArg {
    fn from(v: f32) -> Self {
        KernelArg::F32(v)
    }
}

impl From<QuantizedOut> for KernelArg {
    fn from(v: QuantizedOut) -> Self {
        KernelArg::Quantized(v)
    }
}

/// Where a kernel writes activations quantized as it writes them, laid out as the kernels'
/// `QuantizedOut` (kernels/cuda/q8.cuh); all null for nowhere.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct QuantizedOut {
    pub(crate) hi: u64,
    pub(crate) lo: u64,
    pub(crate) scales: u64,
    pub(crate) sums: u64,
}
