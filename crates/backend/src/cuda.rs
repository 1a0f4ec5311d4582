//! The CUDA runtime under [`GpuBackend`]: cudarc over the driver API, loaded at run time, so a
//! binary built without CUDA runs anywhere. [`CudaBackend::new`] checks for the driver, the
//! device and a kernel image built for exactly the device's architecture before anything else
//! touches CUDA, and says which is missing.
//!
//! On sm_90 and later, with a driver of CUDA 12.3 or newer, short passes launch each kernel with
//! programmatic stream serialisation (programmatic dependent launch): it may start while the
//! previous kernel finishes, so its blocks are resident and its weights on their way when that
//! kernel ends. `LUCEBOX_CUDA_PDL=0` turns this off. sm_86 has no such launch; sm_120 has it, but
//! only sm_90 has run it.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::{
    CUdevice_attribute, CUfunction_attribute, CUgraphInstantiate_flags, CUlaunchAttribute,
    CUlaunchAttributeID, CUlaunchAttributeValue, CUlaunchConfig, CUstreamCaptureMode,
};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaGraph, CudaModule, CudaSlice, CudaStream, DevicePtr,
};
use cudarc::nvrtc::Ptx;

use crate::gpu::{GpuBackend, KernelArg, KernelImage, Runtime, Sealed, unavailable};
use crate::{Error, GpuTuning};

/// The GPU backend on an NVIDIA GPU.
pub type CudaBackend = GpuBackend<Cuda>;

include!(concat!(env!("OUT_DIR"), "/cuda_kernels.rs"));

/// The CUDA driver on one device, with the stream every operation is queued on.
#[derive(Debug)]
pub struct Cuda {
    stream: Arc<CudaStream>,
    /// Whether launches asked to overlap do (programmatic dependent launch): the kernels wait
    /// for their inputs themselves (kernels/portable.cuh).
    overlap_launches: bool,
}

/// Set to `0`, launches do not overlap even where the device could (for measuring the gain).
const OVERLAP_VAR: &str = "LUCEBOX_CUDA_PDL";

/// The first architecture with programmatic dependent launch, and the first driver that
/// records such launches into graphs.
const OVERLAP_MIN_SM: u32 = 90;
const OVERLAP_MIN_DRIVER: i32 = 12030;

impl Sealed for Cuda {}

/// An instantiated CUDA graph.
pub struct CudaGraphExec(CudaGraph);

impl std::fmt::Debug for CudaGraphExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CudaGraphExec")
    }
}

// SAFETY: CUDA graphs are not internally synchronised, so every use must be serialised; the
// backend keeps its graphs in recordings used only through `&mut`, so by one thread at a time.
unsafe impl Send for CudaGraphExec {}

impl Runtime for Cuda {
    const NAME: &'static str = "cuda";
    const GRAPHS_VAR: &'static str = "LUCEBOX_CUDA_GRAPHS";
    const SAMPLING_VAR: &'static str = "LUCEBOX_CUDA_SAMPLING";
    const SKIP_VAR: &'static str = "LUCEBOX_CUDA_SKIP";
    type Buffer = CudaSlice<u8>;
    type Function = CudaFunction;
    type Graph = CudaGraphExec;

    fn alloc_zeroed(&self, bytes: usize) -> Result<CudaSlice<u8>, String> {
        self.stream.alloc_zeros(bytes).map_err(|e| e.to_string())
    }

    fn address(&self, buffer: &CudaSlice<u8>) -> u64 {
        buffer.device_ptr(&self.stream).0
    }

    fn upload(&self, dst: &mut CudaSlice<u8>, src: &[u8]) -> Result<(), String> {
        self.stream
            .memcpy_htod(src, &mut dst.slice_mut(..src.len()))
            .map_err(|e| e.to_string())
    }

    fn download(&self, src: &CudaSlice<u8>, dst: &mut [u8]) -> Result<(), String> {
        self.stream
            .memcpy_dtoh(&src.slice(..dst.len()), dst)
            .map_err(|e| e.to_string())?;
        self.synchronize()
    }

    fn synchronize(&self) -> Result<(), String> {
        self.stream.synchronize().map_err(|e| e.to_string())
    }

    unsafe fn launch(
        &self,
        function: &CudaFunction,
        grid: u32,
        block: u32,
        shared_bytes: u32,
        args: &[KernelArg],
        overlap: bool,
    ) -> Result<(), String> {
        let mut params: Vec<*mut c_void> = args.iter().map(KernelArg::as_ptr).collect();
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| e.to_string())?;
        if !(overlap && self.overlap_launches) {
            // SAFETY: the function and stream are live, the parameters point at `args`, which
            // outlive the call (the driver copies them), and the caller vouches for their types.
            return unsafe {
                cudarc::driver::result::launch_kernel(
                    function.cu_function(),
                    (grid, 1, 1),
                    (block, 1, 1),
                    shared_bytes,
                    self.stream.cu_stream(),
                    &mut params,
                )
            }
            .map_err(|e| e.to_string());
        }
        let mut value = CUlaunchAttributeValue { pad: [0; 64] };
        value.programmaticStreamSerializationAllowed = 1;
        let mut overlap = CUlaunchAttribute {
            id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value,
        };
        let config = CUlaunchConfig {
            gridDimX: grid,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: shared_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut overlap,
            numAttrs: 1,
        };
        // SAFETY: as above; `config` and the attribute it points at outlive the call, and the
        // driver is recent enough to have the entry point (checked when the runtime started).
        unsafe {
            cudarc::driver::sys::cuLaunchKernelEx(
                &config,
                function.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(|e| e.to_string())
    }

    fn allow_shared(&self, function: &CudaFunction, bytes: u32) -> Result<(), String> {
        let bytes = i32::try_from(bytes).map_err(|_| format!("{bytes} bytes of shared memory"))?;
        function
            .set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes,
            )
            .map_err(|e| e.to_string())
    }

    fn max_block_threads(&self, function: &CudaFunction) -> Result<u32, String> {
        let threads = function
            .max_threads_per_block()
            .map_err(|e| e.to_string())?;
        u32::try_from(threads).map_err(|_| format!("{threads} threads per block"))
    }

    fn begin_recording(&self) -> Result<(), String> {
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| e.to_string())
    }

    fn end_recording(&self) -> Result<Option<CudaGraphExec>, String> {
        self.stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map(|graph| graph.map(CudaGraphExec))
            .map_err(|e| e.to_string())
    }

    fn replay(&self, graph: &CudaGraphExec) -> Result<(), String> {
        graph.0.launch().map_err(|e| e.to_string())
    }
}

impl GpuBackend<Cuda> {
    /// The backend on CUDA device `ordinal`, launching its kernels as `tuning` says.
    pub fn new(ordinal: usize, tuning: GpuTuning) -> Result<Self, Error> {
        let fail = unavailable::<Cuda>;
        // SAFETY: only probes whether the driver library can be opened; cudarc would panic on
        // first use without it.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(fail(
                "no CUDA driver (libcuda.so) on this machine: install the NVIDIA driver, or use \
                 the CPU backend"
                    .into(),
            ));
        }
        let count = CudaContext::device_count()
            .map_err(|e| fail(format!("the CUDA driver reports no devices: {e}")))?;
        if ordinal >= count.max(0) as usize {
            return Err(fail(format!(
                "device {ordinal} does not exist: the driver sees {count} CUDA device(s)"
            )));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| fail(format!("cannot open CUDA device {ordinal}: {e}")))?;
        let describe = |e: cudarc::driver::DriverError| fail(format!("CUDA device {ordinal}: {e}"));
        let (major, minor) = ctx.compute_capability().map_err(describe)?;
        let sm = (major * 10 + minor) as u32;
        let name = ctx.name().map_err(describe)?;
        let attribute = |a| ctx.attribute(a).ok().filter(|&v| v > 0).map(f64::from);
        let peak_bandwidth = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)
            .zip(attribute(
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH,
            ))
            .map(|(khz, bits)| 2.0 * khz * 1e3 * bits / 8.0);
        let multiprocessors =
            attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).unwrap_or(1.0)
                as u32;
        let overlap_launches = sm >= OVERLAP_MIN_SM
            && driver_version().is_some_and(|v| v >= OVERLAP_MIN_DRIVER)
            && std::env::var_os(OVERLAP_VAR).is_none_or(|v| v != "0");
        let device = format!(
            "{name}, sm_{sm}{}",
            if overlap_launches { ", PDL" } else { "" }
        );
        let modules = load_modules(&ctx, sm).map_err(|why| fail(format!("{device}: {why}")))?;
        // SAFETY: every operation of this backend runs on its one stream, in issue order, so
        // cudarc's per-buffer events (for work on several streams) are not needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(describe)?;
        GpuBackend::start(
            Cuda {
                stream,
                overlap_launches,
            },
            device,
            peak_bandwidth,
            multiprocessors,
            tuning,
            |family, name| {
                modules
                    .get(family)
                    .ok_or_else(|| format!("no {family} kernels for sm_{sm}"))?
                    .load_function(name)
                    .map_err(|e| format!("kernel {name}: {e}"))
            },
        )
    }
}

/// The driver's CUDA version (12030 for 12.3), when it says.
fn driver_version() -> Option<i32> {
    let mut version = 0;
    // SAFETY: writes one int; the driver library was found before any call.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) }
        .result()
        .ok()
        .map(|()| version)
}

/// The images built for exactly `sm`, loaded, by family; the reason when there are none.
fn load_modules(
    ctx: &Arc<CudaContext>,
    sm: u32,
) -> Result<HashMap<&'static str, Arc<CudaModule>>, String> {
    let Some(nvcc) = COMPILER else {
        return Err(
            "this binary was built without CUDA kernels (nvcc was not found when it was \
                    built; set NVCC and rebuild with --features cuda)"
                .into(),
        );
    };
    let mut modules = HashMap::new();
    let arch = sm.to_string();
    for image in IMAGES.iter().filter(|image| image.arch == arch) {
        let module = ctx
            .load_module(Ptx::from_binary(image.image.to_vec()))
            .map_err(|e| format!("loading the {} kernels for sm_{sm}: {e}", image.family))?;
        modules.insert(image.family, module);
    }
    if modules.is_empty() {
        let mut built: Vec<String> = IMAGES.iter().map(|i| format!("sm_{}", i.arch)).collect();
        built.dedup();
        return Err(format!(
            "this binary has CUDA kernels for {} ({nvcc}), not for this device's sm_{sm}: use \
             the package built for this GPU",
            built.join(", ")
        ));
    }
    Ok(modules)
}
