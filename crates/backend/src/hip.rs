//! The HIP runtime under [`GpuBackend`], for AMD RDNA GPUs (gfx1100, gfx1151, gfx1201): the
//! same kernels as CUDA (`kernels/cuda/`, through `kernels/portable.cuh`), built as code objects
//! by hipcc, loaded with HIP's module API.
//!
//! The binary links `libamdhip64` (hip-sys). [`HipBackend::new`] checks for a device, its
//! 32-wide waves and a code object built for it before anything else, and says which is
//! missing. None of this has run on an AMD GPU: no machine of the project has one (README).

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::ptr;

use hip_sys::hiprt::{
    hipDeviceAttribute_t, hipFunction_t, hipGraph_t, hipGraphExec_t, hipModule_t, hipStream_t,
};

use crate::gpu::{GpuBackend, KernelArg, KernelImage, Runtime, Sealed, unavailable};
use crate::{Error, GpuTuning};

/// The GPU backend on an AMD GPU.
pub type HipBackend = GpuBackend<Hip>;

include!(concat!(env!("OUT_DIR"), "/hip_kernels.rs"));

// The runtime's entry points, declared here with `hipError_t` as the C `int` it is: hip-sys's
// bindings (HIP 5.4) make it a Rust enum, and a newer runtime (ROCm 6, 7.2) may return a code
// that enum lacks, which Rust may not hold. hip-sys links the library and gives the handles.
unsafe extern "C" {
    fn hipInit(flags: c_uint) -> c_int;
    fn hipGetDeviceCount(count: *mut c_int) -> c_int;
    fn hipSetDevice(device: c_int) -> c_int;
    fn hipDeviceGetName(name: *mut c_char, len: c_int, device: c_int) -> c_int;
    fn hipDeviceGetAttribute(value: *mut c_int, attribute: c_int, device: c_int) -> c_int;
    fn hipRuntimeGetVersion(version: *mut c_int) -> c_int;
    fn hipGetErrorString(error: c_int) -> *const c_char;
    fn hipStreamCreateWithFlags(stream: *mut hipStream_t, flags: c_uint) -> c_int;
    fn hipStreamDestroy(stream: hipStream_t) -> c_int;
    fn hipStreamSynchronize(stream: hipStream_t) -> c_int;
    fn hipMalloc(pointer: *mut *mut c_void, bytes: usize) -> c_int;
    fn hipFree(pointer: *mut c_void) -> c_int;
    fn hipMemsetAsync(
        pointer: *mut c_void,
        value: c_int,
        bytes: usize,
        stream: hipStream_t,
    ) -> c_int;
    fn hipMemcpyHtoDAsync(
        dst: *mut c_void,
        src: *mut c_void,
        bytes: usize,
        stream: hipStream_t,
    ) -> c_int;
    fn hipMemcpyDtoHAsync(
        dst: *mut c_void,
        src: *mut c_void,
        bytes: usize,
        stream: hipStream_t,
    ) -> c_int;
    fn hipModuleLoadData(module: *mut hipModule_t, image: *const c_void) -> c_int;
    fn hipModuleUnload(module: hipModule_t) -> c_int;
    fn hipFuncGetAttribute(value: *mut c_int, attribute: c_int, function: hipFunction_t) -> c_int;
    fn hipModuleGetFunction(
        function: *mut hipFunction_t,
        module: hipModule_t,
        name: *const c_char,
    ) -> c_int;
    fn hipModuleLaunchKernel(
        function: hipFunction_t,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared_bytes: c_uint,
        stream: hipStream_t,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> c_int;
    fn hipStreamBeginCapture(stream: hipStream_t, mode: c_int) -> c_int;
    fn hipStreamEndCapture(stream: hipStream_t, graph: *mut hipGraph_t) -> c_int;
    fn hipGraphInstantiate(
        exec: *mut hipGraphExec_t,
        graph: hipGraph_t,
        error_node: *mut c_void,
        log: *mut c_char,
        log_bytes: usize,
    ) -> c_int;
    fn hipGraphDestroy(graph: hipGraph_t) -> c_int;
    fn hipGraphLaunch(exec: hipGraphExec_t, stream: hipStream_t) -> c_int;
    fn hipGraphExecDestroy(exec: hipGraphExec_t) -> c_int;
}

const HIP_SUCCESS: c_int = 0;
const HIP_ERROR_NO_DEVICE: c_int = 100;
const HIP_STREAM_NON_BLOCKING: c_uint = 1;
const HIP_STREAM_CAPTURE_MODE_THREAD_LOCAL: c_int = 1;
/// `hipFunction_attribute`'s first value (as CUDA's `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`).
const HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: c_int = 0;
/// The shared memory (LDS) a workgroup may take on the RDNA3 and RDNA4 GPUs the HIP kernels
/// are built for.
const HIP_WORKGROUP_LDS: u32 = 64 * 1024;

/// `Ok` for success, else the runtime's description of `code`.
fn check(code: c_int) -> Result<(), String> {
    if code == HIP_SUCCESS {
        return Ok(());
    }
    // SAFETY: hipGetErrorString takes any code and returns a static C string (or null).
    let text = unsafe { hipGetErrorString(code) };
    let text = if text.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, so a NUL-terminated string the runtime keeps for the process.
        unsafe { CStr::from_ptr(text) }.to_string_lossy()
    };
    Err(format!("{text} (hipError {code})"))
}

/// The HIP runtime on one device, with the stream every operation is queued on and the
/// modules its kernels come from.
#[derive(Debug)]
pub struct Hip {
    device: c_int,
    stream: hipStream_t,
    modules: Vec<hipModule_t>,
}

impl Sealed for Hip {}

// SAFETY: the HIP runtime's calls are thread-safe, and the handles are only passed to it.
unsafe impl Send for Hip {}
// SAFETY: as above; the stream orders the work of every thread that queues on it.
unsafe impl Sync for Hip {}

impl Hip {
    /// Makes this runtime's device the calling thread's current one, for the calls that act on
    /// the current device (allocation, module loads, graphs).
    fn bind(&self) -> Result<(), String> {
        // SAFETY: plain call with a device ordinal that `new` checked.
        check(unsafe { hipSetDevice(self.device) })
    }

    /// Loads every family of `arch`'s images; their modules by family.
    fn load(&mut self, arch: &str) -> Result<Modules, String> {
        let mut loaded = Vec::new();
        for image in IMAGES.iter().filter(|image| image.arch == arch) {
            let mut module = ptr::null_mut();
            // SAFETY: `image` is a code object built by hipcc, embedded for the process's
            // lifetime; the runtime copies what it needs.
            let code = unsafe { hipModuleLoadData(&mut module, image.image.as_ptr().cast()) };
            check(code)
                .map_err(|e| format!("loading the {} kernels for {arch}: {e}", image.family))?;
            self.modules.push(module);
            loaded.push((image.family, module));
        }
        Ok(loaded)
    }
}

impl Drop for Hip {
    fn drop(&mut self) {
        // SAFETY: the modules and stream were created by this runtime and are not used again:
        // the backend that owned this runtime is being dropped, after every buffer and graph
        // of its (they hold the backend alive).
        unsafe {
            for &module in &self.modules {
                hipModuleUnload(module);
            }
            hipStreamDestroy(self.stream);
        }
    }
}

/// Device memory from hipMalloc.
#[derive(Debug)]
pub struct HipBuffer(*mut c_void);

// SAFETY: a device address, usable from any thread.
unsafe impl Send for HipBuffer {}
// SAFETY: as above; the buffer itself is only read or written by queued work.
unsafe impl Sync for HipBuffer {}

impl Drop for HipBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by hipMalloc and freed once; hipFree waits for work using it.
        unsafe { hipFree(self.0) };
    }
}

/// A kernel loaded from a module the runtime keeps loaded.
#[derive(Debug)]
pub struct HipFunction(hipFunction_t);

// SAFETY: a function handle is immutable once loaded, usable from any thread.
unsafe impl Send for HipFunction {}
// SAFETY: as above.
unsafe impl Sync for HipFunction {}

/// An instantiated HIP graph.
#[derive(Debug)]
pub struct HipGraph(hipGraphExec_t);

// SAFETY: graphs are not internally synchronised; the backend keeps them in recordings used
// only through `&mut`, so by one thread at a time.
unsafe impl Send for HipGraph {}

impl Drop for HipGraph {
    fn drop(&mut self) {
        // SAFETY: instantiated by `end_recording` and destroyed once.
        unsafe { hipGraphExecDestroy(self.0) };
    }
}

impl Runtime for Hip {
    const NAME: &'static str = "hip";
    const GRAPHS_VAR: &'static str = "LUCEBOX_HIP_GRAPHS";
    const SAMPLING_VAR: &'static str = "LUCEBOX_HIP_SAMPLING";
    const SKIP_VAR: &'static str = "LUCEBOX_HIP_SKIP";
    type Buffer = HipBuffer;
    type Function = HipFunction;
    type Graph = HipGraph;

    fn alloc_zeroed(&self, bytes: usize) -> Result<HipBuffer, String> {
        self.bind()?;
        let mut pointer = ptr::null_mut();
        // SAFETY: hipMalloc writes the new address to `pointer`.
        check(unsafe { hipMalloc(&mut pointer, bytes) })?;
        let buffer = HipBuffer(pointer);
        // SAFETY: the buffer holds `bytes` bytes; queued on the stream, so every later
        // use sees the zeros.
        check(unsafe { hipMemsetAsync(pointer, 0, bytes, self.stream) })?;
        Ok(buffer)
    }

    fn address(&self, buffer: &HipBuffer) -> u64 {
        buffer.0 as u64
    }

    fn upload(&self, dst: &mut HipBuffer, src: &[u8]) -> Result<(), String> {
        // SAFETY: the caller checked that `dst` holds `src.len()` bytes; the stream is
        // synchronised before returning, so `src` is no longer read after.
        check(unsafe {
            hipMemcpyHtoDAsync(
                dst.0,
                src.as_ptr().cast_mut().cast(),
                src.len(),
                self.stream,
            )
        })?;
        self.synchronize()
    }

    fn download(&self, src: &HipBuffer, dst: &mut [u8]) -> Result<(), String> {
        // SAFETY: the caller checked that `src` holds `dst.len()` bytes; the stream is
        // synchronised before returning, so `dst` is written by then and not after.
        check(unsafe {
            hipMemcpyDtoHAsync(dst.as_mut_ptr().cast(), src.0, dst.len(), self.stream)
        })?;
        self.synchronize()
    }

    fn synchronize(&self) -> Result<(), String> {
        // SAFETY: a live stream.
        check(unsafe { hipStreamSynchronize(self.stream) })
    }

    unsafe fn launch(
        &self,
        function: &HipFunction,
        grid: u32,
        block: u32,
        shared_bytes: u32,
        args: &[KernelArg],
        // HIP has no launch that overlaps its predecessor: kernels run in turn.
        _overlap: bool,
    ) -> Result<(), String> {
        let mut params: Vec<*mut c_void> = args.iter().map(KernelArg::as_ptr).collect();
        // SAFETY: the function and stream are live, the parameters point at `args`, which
        // outlive the call (the runtime copies them), and the caller vouches for their types.
        check(unsafe {
            hipModuleLaunchKernel(
                function.0,
                grid,
                1,
                1,
                block,
                1,
                1,
                shared_bytes,
                self.stream,
                params.as_mut_ptr(),
                ptr::null_mut(),
            )
        })
    }

    fn allow_shared(&self, _function: &HipFunction, bytes: u32) -> Result<(), String> {
        // A workgroup of these GPUs may take all of its 64 KiB of LDS unasked.
        if bytes > HIP_WORKGROUP_LDS {
            return Err(format!(
                "{bytes} bytes of shared memory: a workgroup has {HIP_WORKGROUP_LDS}"
            ));
        }
        Ok(())
    }

    fn max_block_threads(&self, function: &HipFunction) -> Result<u32, String> {
        let mut threads = 0;
        // SAFETY: a loaded function; the value is written on success.
        check(unsafe {
            hipFuncGetAttribute(
                &mut threads,
                HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                function.0,
            )
        })?;
        u32::try_from(threads).map_err(|_| format!("{threads} threads per block"))
    }

    fn begin_recording(&self) -> Result<(), String> {
        self.bind()?;
        // SAFETY: a live stream, not already recording (the backend records one pass at a
        // time and always ends it).
        check(unsafe { hipStreamBeginCapture(self.stream, HIP_STREAM_CAPTURE_MODE_THREAD_LOCAL) })
    }

    fn end_recording(&self) -> Result<Option<HipGraph>, String> {
        let mut graph = ptr::null_mut();
        // SAFETY: the stream is recording (begin_recording); the graph is written on success.
        check(unsafe { hipStreamEndCapture(self.stream, &mut graph) })?;
        if graph.is_null() {
            return Ok(None);
        }
        let mut exec = ptr::null_mut();
        // SAFETY: `graph` was just recorded; it is destroyed once instantiated, which the
        // instance does not need.
        let instantiated = check(unsafe {
            hipGraphInstantiate(&mut exec, graph, ptr::null_mut(), ptr::null_mut(), 0)
        });
        // SAFETY: as above.
        unsafe { hipGraphDestroy(graph) };
        instantiated.map(|()| Some(HipGraph(exec)))
    }

    fn replay(&self, graph: &HipGraph) -> Result<(), String> {
        // SAFETY: an instantiated graph and a live stream.
        check(unsafe { hipGraphLaunch(graph.0, self.stream) })
    }
}

impl GpuBackend<Hip> {
    /// The backend on HIP device `ordinal`, launching its kernels as `tuning` says.
    pub fn new(ordinal: usize, tuning: GpuTuning) -> Result<Self, Error> {
        let fail = unavailable::<Hip>;
        let no_gpu = |why: String| {
            fail(format!(
                "no AMD GPU that HIP can use on this machine ({why}): check that the amdgpu \
                 driver is loaded and that this user may open /dev/kfd, or use the CPU backend"
            ))
        };
        // SAFETY: a plain call, made before any other.
        check(unsafe { hipInit(0) }).map_err(|e| no_gpu(format!("hipInit: {e}")))?;
        let mut count = 0;
        // SAFETY: the count is written on success.
        match unsafe { hipGetDeviceCount(&mut count) } {
            HIP_SUCCESS if count > 0 => {}
            HIP_SUCCESS | HIP_ERROR_NO_DEVICE => return Err(no_gpu("HIP sees no device".into())),
            code => {
                let why = check(code).err().unwrap_or_default();
                return Err(no_gpu(format!("hipGetDeviceCount: {why}")));
            }
        }
        let device = c_int::try_from(ordinal)
            .ok()
            .filter(|&device| device < count)
            .ok_or_else(|| {
                fail(format!(
                    "device {ordinal} does not exist: HIP sees {count} device(s)"
                ))
            })?;
        let describe = |e: String| fail(format!("HIP device {ordinal}: {e}"));
        // SAFETY: a device that exists.
        check(unsafe { hipSetDevice(device) }).map_err(describe)?;
        let mut name = [0 as c_char; 256];
        // SAFETY: the runtime writes at most `name.len()` bytes, NUL-terminated.
        check(unsafe { hipDeviceGetName(name.as_mut_ptr(), name.len() as c_int, device) })
            .map_err(describe)?;
        // SAFETY: NUL-terminated by hipDeviceGetName.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let attribute = |attribute: hipDeviceAttribute_t| {
            let mut value = 0;
            // SAFETY: the value is written on success; the attribute ids are HIP's
            // (unchanged from HIP 5 to ROCm 7).
            let code = unsafe { hipDeviceGetAttribute(&mut value, attribute as c_int, device) };
            (code == HIP_SUCCESS).then_some(value)
        };
        let wave = attribute(hipDeviceAttribute_t::hipDeviceAttributeWarpSize);
        if wave != Some(32) {
            return Err(fail(format!(
                "{name}: the device runs {} waves; the kernels need 32-wide waves (RDNA: gfx10, \
                 gfx11, gfx12)",
                wave.map_or("unknown".into(), |w| format!("{w}-wide"))
            )));
        }
        let peak_bandwidth = attribute(hipDeviceAttribute_t::hipDeviceAttributeMemoryClockRate)
            .zip(attribute(
                hipDeviceAttribute_t::hipDeviceAttributeMemoryBusWidth,
            ))
            .filter(|&(khz, bits)| khz > 0 && bits > 0)
            .map(|(khz, bits)| 2.0 * f64::from(khz) * 1e3 * f64::from(bits) / 8.0);
        let multiprocessors =
            attribute(hipDeviceAttribute_t::hipDeviceAttributeMultiprocessorCount)
                .filter(|&count| count > 0)
                .map_or(1, |count| count as u32);
        let mut stream = ptr::null_mut();
        // SAFETY: the stream is written on success.
        check(unsafe { hipStreamCreateWithFlags(&mut stream, HIP_STREAM_NON_BLOCKING) })
            .map_err(describe)?;
        let mut runtime = Hip {
            device,
            stream,
            modules: Vec::new(),
        };
        let (arch, modules) = load_modules(&mut runtime, &name).map_err(fail)?;
        let mut version = 0;
        // SAFETY: the version is written on success.
        let runtime_version = if unsafe { hipRuntimeGetVersion(&mut version) } == HIP_SUCCESS {
            // HIP_VERSION is major * 10^7 + minor * 10^5 + patch.
            format!(
                ", HIP runtime {}.{}",
                version / 10_000_000,
                version / 100_000 % 100
            )
        } else {
            String::new()
        };
        let described = format!("{name}, {arch}{runtime_version}");
        GpuBackend::start(
            runtime,
            described,
            peak_bandwidth,
            multiprocessors,
            tuning,
            |family, kernel| {
                let module = modules
                    .iter()
                    .find(|(f, _)| *f == family)
                    .map(|&(_, module)| module)
                    .ok_or_else(|| format!("no {family} kernels for {arch}"))?;
                let c_name = std::ffi::CString::new(kernel).map_err(|e| e.to_string())?;
                let mut function = ptr::null_mut();
                // SAFETY: a loaded module and a NUL-terminated name; the handle is written on
                // success and lives as long as the module, which the runtime keeps.
                check(unsafe { hipModuleGetFunction(&mut function, module, c_name.as_ptr()) })
                    .map_err(|e| format!("kernel {kernel}: {e}"))?;
                Ok(HipFunction(function))
            },
        )
    }
}

/// The modules of one architecture's images, by family.
type Modules = Vec<(&'static str, hipModule_t)>;

/// Loads the images of the first architecture whose code objects this device takes; that
/// architecture and its modules, or why none.
fn load_modules(runtime: &mut Hip, device_name: &str) -> Result<(&'static str, Modules), String> {
    let Some(hipcc) = COMPILER else {
        return Err(format!(
            "{device_name}: this binary was built without HIP kernels (hipcc was not found when \
             it was built; set HIPCC and rebuild with --features hip, or use the package built \
             for this GPU)"
        ));
    };
    let mut archs: Vec<&'static str> = IMAGES.iter().map(|image| image.arch).collect();
    archs.dedup();
    runtime.bind()?;
    let mut refusals = Vec::new();
    for &arch in &archs {
        match runtime.load(arch) {
            Ok(modules) => return Ok((arch, modules)),
            Err(why) => refusals.push(why),
        }
    }
    Err(format!(
        "{device_name}: this binary has HIP kernels for {} ({hipcc}), which this device cannot \
         load ({}): use the package built for this GPU",
        archs.join(", "),
        refusals.join("; ")
    ))
}
