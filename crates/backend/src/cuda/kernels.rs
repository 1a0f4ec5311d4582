//! The compiled kernel images built into this binary (by build.rs, from `kernels/cuda/`) and the
//! functions loaded from the one that matches the device.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;
use lucebox_gguf::GgmlType;

use super::{FormatKernels, QuantizedKernels};

/// One kernel family (a `kernels/cuda/*.cu` file) compiled for one architecture: its cubin and
/// its PTX in a fatbin.
pub(crate) struct KernelImage {
    pub(crate) family: &'static str,
    pub(crate) sm: u32,
    pub(crate) fatbin: &'static [u8],
}

include!(concat!(env!("OUT_DIR"), "/cuda_kernels.rs"));

/// Every kernel, loaded for one device.
pub(crate) struct Kernels {
    formats: HashMap<GgmlType, FormatKernels>,
    pub(crate) rms_norm: CudaFunction,
    pub(crate) rms_norm_heads: CudaFunction,
    pub(crate) rope: CudaFunction,
    pub(crate) store_kv: CudaFunction,
    pub(crate) attention: CudaFunction,
    pub(crate) silu_mul: CudaFunction,
    pub(crate) add: CudaFunction,
    pub(crate) gather_rows: CudaFunction,
    pub(crate) argmax_rows: CudaFunction,
    pub(crate) quantize_q8: CudaFunction,
}

impl Kernels {
    /// Loads the images built for exactly `sm`; the reason when there are none.
    pub(crate) fn load(ctx: &Arc<CudaContext>, sm: u32) -> Result<Self, String> {
        let Some(nvcc) = NVCC_VERSION else {
            return Err(
                "this binary was built without CUDA kernels (nvcc was not found when it \
                        was built; set NVCC and rebuild with --features cuda)"
                    .into(),
            );
        };
        let mut modules: HashMap<&str, Arc<CudaModule>> = HashMap::new();
        for image in IMAGES.iter().filter(|image| image.sm == sm) {
            let module = ctx
                .load_module(Ptx::from_binary(image.fatbin.to_vec()))
                .map_err(|e| format!("loading the {} kernels for sm_{sm}: {e}", image.family))?;
            modules.insert(image.family, module);
        }
        if modules.is_empty() {
            let mut built: Vec<String> = IMAGES.iter().map(|i| format!("sm_{}", i.sm)).collect();
            built.dedup();
            return Err(format!(
                "this binary has CUDA kernels for {} ({nvcc}), not for this device's sm_{sm}: \
                 use the package built for this GPU",
                built.join(", ")
            ));
        }
        let function = |family: &str, name: &str| -> Result<CudaFunction, String> {
            modules
                .get(family)
                .ok_or_else(|| format!("no {family} kernels for sm_{sm}"))?
                .load_function(name)
                .map_err(|e| format!("kernel {name}: {e}"))
        };
        // The formats with kernels are those kernels/cuda/quant.cuh instantiates.
        let formats = GgmlType::ALL
            .iter()
            .filter_map(|&ty| {
                let suffix = ty.name().to_lowercase();
                let mmv = function("mmv", &format!("mmv_{suffix}")).ok()?;
                let get_rows = function("mmv", &format!("get_rows_{suffix}")).ok()?;
                // The float formats multiply f32 activations and have no one-row instance.
                let quantized = function("mmv", &format!("mmv1_{suffix}"))
                    .ok()
                    .map(|mmv1| QuantizedKernels { mmv1 });
                Some((
                    ty,
                    FormatKernels {
                        ty,
                        mmv,
                        quantized,
                        get_rows,
                    },
                ))
            })
            .collect();
        Ok(Self {
            formats,
            rms_norm: function("norm", "rms_norm")?,
            rms_norm_heads: function("norm", "rms_norm_heads")?,
            rope: function("rope", "rope")?,
            store_kv: function("attention", "store_kv")?,
            attention: function("attention", "attention")?,
            silu_mul: function("elementwise", "silu_mul")?,
            add: function("elementwise", "add")?,
            gather_rows: function("elementwise", "gather_rows")?,
            argmax_rows: function("argmax", "argmax_rows")?,
            quantize_q8: function("quantize", "quantize_q8")?,
        })
    }

    /// The kernels of storage type `ty`, if the images have them.
    pub(crate) fn format(&self, ty: GgmlType) -> Option<FormatKernels> {
        self.formats.get(&ty).cloned()
    }
}
