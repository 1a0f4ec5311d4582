//! Turning `--model` and `--draft` arguments into models on a backend.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use lucebox_appliance::{BackendKind, HostProfile};
use lucebox_backend::{ActivationPrecision, Backend, CpuBackend, GpuTuning};
use lucebox_gguf::GgufFile;
use lucebox_model::Model;

/// A model loaded from a `--model`-style argument, on the CPU unless said otherwise.
pub(crate) struct Loaded<B: Backend = CpuBackend> {
    /// The argument as given.
    pub label: String,
    /// The catalogue entry the argument named, or whose name the file carries.
    pub catalogue_name: Option<String>,
    pub path: PathBuf,
    pub file: Arc<GgufFile>,
    pub model: Arc<Model<B>>,
}

/// A model argument: a GGUF path, or the name of a catalogue model, fetched first when the
/// model directory does not hold it yet. Returns the path and the catalogue name, if any.
pub(crate) fn resolve_model(arg: &str) -> anyhow::Result<(PathBuf, Option<String>)> {
    let catalogue = lucebox_appliance::Catalogue::embedded()?;
    let path = PathBuf::from(arg);
    if path.is_file() {
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        let name = catalogue.model(stem).ok().map(|m| m.name().to_owned());
        return Ok((path, name));
    }
    let Ok(model) = catalogue.model(arg) else {
        bail!(
            "{arg}: no such file, and no catalogue model of that name (see `lucebox fetch --list`)"
        );
    };
    let cached = lucebox_appliance::model_path(&lucebox_appliance::model_dir()?, arg);
    let name = Some(model.name().to_owned());
    if lucebox_appliance::Presence::of(&cached, model.bytes())?
        == lucebox_appliance::Presence::Present
    {
        return Ok((cached, name));
    }
    Ok((crate::fetch::fetch_model(model)?, name))
}

/// Which compute backend a command runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Device {
    /// The CPU backend.
    #[default]
    Cpu,
    /// The first CUDA device (builds with the `cuda` feature).
    Cuda,
    /// The first HIP device: an AMD RDNA GPU (builds with the `hip` feature).
    Hip,
}

impl Device {
    /// The device a host profile's engine runs on (`[engine] backend`).
    pub(crate) fn of_profile(profile: &HostProfile) -> Device {
        match profile.engine().backend {
            BackendKind::Cpu => Device::Cpu,
            BackendKind::Cuda => Device::Cuda,
            BackendKind::Hip => Device::Hip,
        }
    }

    /// Fails, in one line, when this build lacks the device's backend (as [`on_device`] does).
    pub(crate) fn ensure_built(self) -> anyhow::Result<()> {
        match self {
            #[cfg(not(feature = "cuda"))]
            Device::Cuda => bail!(NO_CUDA),
            #[cfg(not(feature = "hip"))]
            Device::Hip => bail!(NO_HIP),
            _ => Ok(()),
        }
    }
}

/// `--activations`: how finely the target's matmuls quantize their activations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Activations {
    /// Two 8-bit parts per value (about 16 bits): the weights' rounding alone reaches the logits.
    #[default]
    Split,
    /// One 8-bit part, as llama.cpp: half the integer work of a batch, prefill or verify step,
    /// at 8-bit accuracy.
    Single,
}

impl From<Activations> for ActivationPrecision {
    fn from(activations: Activations) -> Self {
        match activations {
            Activations::Split => ActivationPrecision::Split,
            Activations::Single => ActivationPrecision::Single,
        }
    }
}

/// The flags that override a host profile's `[kernels]` table: how the GPU kernels are
/// launched, to tune a chip. Their help names the backend's defaults, not copies of them.
#[derive(Debug, Default, clap::Args)]
pub(crate) struct TuningArgs {
    #[arg(long, help = tuning_help(
        "weight rows per block of the matrix-vector kernels, one warp (wave) each",
        GpuTuning::DEFAULT.matvec_warps,
    ))]
    matvec_warps: Option<u32>,
    #[arg(long, help = tuning_help(
        "warps (waves) per block of attention",
        GpuTuning::DEFAULT.attention_warps,
    ))]
    attention_warps: Option<u32>,
    #[arg(long, help = tuning_help(
        "up to this many activation rows, a matvec runs its one-row kernel once per row",
        GpuTuning::DEFAULT.matvec_loop_rows,
    ))]
    matvec_loop_rows: Option<u32>,
    #[arg(long, help = tuning_help(
        "the most query heads of one KV head that a block of a batch's attention takes together",
        GpuTuning::DEFAULT.attention_group,
    ))]
    attention_group: Option<u32>,
    #[arg(long, help = tuning_help(
        "from this many activation rows, a quantized matmul runs on the tensor cores where the \
         device has them",
        GpuTuning::DEFAULT.mmq_rows,
    ))]
    mmq_rows: Option<u32>,
    #[arg(long, value_name = "BOOL", help = format!(
        "GPU only: every pass of a Q4_K or Q6_K matrix through the streamed tensor-core matmul \
         [default: the profile's `[kernels]`, else {}]",
        GpuTuning::DEFAULT.streamed_matmul,
    ))]
    streamed_matmul: Option<bool>,
    #[arg(long, value_name = "BOOL", help = format!(
        "GPU only: prompt tokens' rows of the layers' matmuls through an f16 GEMM, each matrix \
         dequantized just before it [default: the profile's `[kernels]`, else {}]",
        GpuTuning::DEFAULT.prompt_gemm,
    ))]
    prompt_gemm: Option<bool>,
    #[arg(long, value_name = "BOOL", help = format!(
        "GPU only: prompt tokens' rows of attention on f16 tensor-core tiles [default: the \
         profile's `[kernels]`, else {}]",
        GpuTuning::DEFAULT.prompt_attention,
    ))]
    prompt_attention: Option<bool>,
    #[arg(long, help = tuning_help(
        "prompts of at least this many tokens take the prompt kernels (--prompt-gemm, \
         --prompt-attention); shorter ones' rows take generated tokens' kernels",
        GpuTuning::DEFAULT.prompt_rows_from,
    ))]
    prompt_rows_from: Option<u32>,
}

/// The help of a tuning flag that sets `what`, `default` without a profile.
fn tuning_help(what: &str, default: u32) -> String {
    format!("GPU only: {what} [default: the profile's `[kernels]`, else {default}]")
}

impl TuningArgs {
    /// The numeric flags and their values, given or not.
    fn numbers(&self) -> [(&'static str, Option<u32>); 6] {
        [
            ("--matvec-warps", self.matvec_warps),
            ("--attention-warps", self.attention_warps),
            ("--matvec-loop-rows", self.matvec_loop_rows),
            ("--attention-group", self.attention_group),
            ("--mmq-rows", self.mmq_rows),
            ("--prompt-rows-from", self.prompt_rows_from),
        ]
    }

    /// The on/off flags and their values, given or not.
    fn switches(&self) -> [(&'static str, Option<bool>); 3] {
        [
            ("--streamed-matmul", self.streamed_matmul),
            ("--prompt-gemm", self.prompt_gemm),
            ("--prompt-attention", self.prompt_attention),
        ]
    }

    /// The flags given, as arguments for a `lucebox` command this one starts.
    pub(crate) fn to_args(&self) -> Vec<String> {
        self.numbers()
            .into_iter()
            .filter_map(|(flag, value)| Some((flag, value?.to_string())))
            .chain(
                self.switches()
                    .into_iter()
                    .filter_map(|(flag, on)| Some((flag, on?.to_string()))),
            )
            .flat_map(|(flag, value)| [flag.to_owned(), value])
            .collect()
    }

    /// The launch shapes for `device`: these flags over `profile`'s `[kernels]` over the
    /// backend's defaults. The backend checks the ranges when it starts.
    pub(crate) fn resolve(
        &self,
        profile: Option<&HostProfile>,
        device: Device,
    ) -> anyhow::Result<GpuTuning> {
        if device == Device::Cpu
            && (self.numbers().iter().any(|(_, value)| value.is_some())
                || self.switches().iter().any(|(_, on)| on.is_some()))
        {
            bail!(
                "--matvec-warps, --attention-warps, --matvec-loop-rows, --attention-group, \
                 --mmq-rows, --streamed-matmul, --prompt-gemm, --prompt-attention and \
                 --prompt-rows-from tune the GPU kernels, not --device cpu"
            );
        }
        let base = profile
            .and_then(HostProfile::kernels)
            .map_or(GpuTuning::DEFAULT, |k| GpuTuning {
                matvec_warps: k.matvec_warps,
                attention_warps: k.attention_warps,
                matvec_loop_rows: k.matvec_loop_rows,
                attention_group: k
                    .attention_group
                    .unwrap_or(GpuTuning::DEFAULT.attention_group),
                mmq_rows: k.mmq_rows.unwrap_or(GpuTuning::DEFAULT.mmq_rows),
                streamed_matmul: k
                    .streamed_matmul
                    .unwrap_or(GpuTuning::DEFAULT.streamed_matmul),
                prompt_gemm: k.prompt_gemm.unwrap_or(GpuTuning::DEFAULT.prompt_gemm),
                prompt_attention: k
                    .prompt_attention
                    .unwrap_or(GpuTuning::DEFAULT.prompt_attention),
                prompt_rows_from: k
                    .prompt_rows_from
                    .unwrap_or(GpuTuning::DEFAULT.prompt_rows_from),
            });
        Ok(GpuTuning {
            matvec_warps: self.matvec_warps.unwrap_or(base.matvec_warps),
            attention_warps: self.attention_warps.unwrap_or(base.attention_warps),
            matvec_loop_rows: self.matvec_loop_rows.unwrap_or(base.matvec_loop_rows),
            attention_group: self.attention_group.unwrap_or(base.attention_group),
            mmq_rows: self.mmq_rows.unwrap_or(base.mmq_rows),
            streamed_matmul: self.streamed_matmul.unwrap_or(base.streamed_matmul),
            prompt_gemm: self.prompt_gemm.unwrap_or(base.prompt_gemm),
            prompt_attention: self.prompt_attention.unwrap_or(base.prompt_attention),
            prompt_rows_from: self.prompt_rows_from.unwrap_or(base.prompt_rows_from),
        })
    }
}

/// Evaluates `$body` with `$backend` bound to `&Arc<B>`, the backend of `$device` (the CPU one
/// with `$threads` threads, a GPU one launching its kernels as `$tuning` says), in the
/// function's `anyhow::Result`; a device this build lacks is an error. A macro, because the
/// body is generic over the backend's type.
macro_rules! on_device {
    ($device:expr, $threads:expr, $tuning:expr, |$backend:ident| $body:expr) => {{
        let tuning: lucebox_backend::GpuTuning = $tuning;
        #[cfg(not(any(feature = "cuda", feature = "hip")))]
        let _ = tuning;
        match $device {
            $crate::load::Device::Cpu => {
                let $backend = &$crate::load::cpu_backend($threads)?;
                $body
            }
            #[cfg(feature = "cuda")]
            $crate::load::Device::Cuda => {
                let $backend = &std::sync::Arc::new(lucebox_backend::CudaBackend::new(0, tuning)?);
                $body
            }
            #[cfg(feature = "hip")]
            $crate::load::Device::Hip => {
                let $backend = &std::sync::Arc::new(lucebox_backend::HipBackend::new(0, tuning)?);
                $body
            }
            #[cfg(not(feature = "cuda"))]
            $crate::load::Device::Cuda => anyhow::bail!($crate::load::NO_CUDA),
            #[cfg(not(feature = "hip"))]
            $crate::load::Device::Hip => anyhow::bail!($crate::load::NO_HIP),
        }
    }};
}
pub(crate) use on_device;

/// What a build without the CUDA backend says when asked for it.
#[cfg(not(feature = "cuda"))]
pub(crate) const NO_CUDA: &str = "the cuda device: this lucebox was built without the CUDA backend (cargo build --features cuda)";

/// What a build without the HIP backend says when asked for it.
#[cfg(not(feature = "hip"))]
pub(crate) const NO_HIP: &str = "the hip device: this lucebox was built without the HIP backend (cargo build --features hip, with the HIP headers and libamdhip64)";

/// The CPU backend with `threads` threads (all cores when `None`), shared by every model of a
/// command so that target and drafter do not compete with two thread pools.
pub(crate) fn cpu_backend(threads: Option<usize>) -> anyhow::Result<Arc<CpuBackend>> {
    Ok(Arc::new(CpuBackend::new(threads)?))
}

/// The model named by `arg`, on `backend`, its matmuls quantizing activations at `precision`.
pub(crate) fn load_model<B: Backend>(
    arg: &str,
    backend: &Arc<B>,
    precision: ActivationPrecision,
) -> anyhow::Result<Loaded<B>> {
    let (path, catalogue_name) = resolve_model(arg)?;
    let file = Arc::new(GgufFile::open(&path).with_context(|| path.display().to_string())?);
    let model = Model::load_with_precision(Arc::clone(backend), Arc::clone(&file), precision)
        .with_context(|| path.display().to_string())?;
    Ok(Loaded {
        label: arg.to_owned(),
        catalogue_name,
        path,
        file,
        model: Arc::new(model),
    })
}

/// The backend a model runs on and its activation precision, for reports.
pub(crate) fn describe<B: Backend>(model: &Model<B>) -> String {
    format!(
        "{}, {} activations",
        model.backend().describe(),
        model.activation_precision()
    )
}

/// The precision a drafter's matmuls run at on `B`: the cheapest it has. A drafter only
/// proposes; the target decides every token, so its precision cannot change the output.
pub(crate) fn drafter_precision<B: Backend>() -> ActivationPrecision {
    *B::ACTIVATION_PRECISIONS
        .last()
        .expect("every backend takes some precision")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gpu_profile_s_kernel_tuning_is_in_the_kernels_range() {
        for profile in HostProfile::embedded_all().unwrap() {
            let device = Device::of_profile(&profile);
            let tuning = TuningArgs::default()
                .resolve(Some(&profile), device)
                .unwrap();
            tuning
                .validate()
                .unwrap_or_else(|e| panic!("hosts/{}.toml: {e}", profile.chip().name()));
            assert_eq!(profile.kernels().is_some(), device != Device::Cpu);
            // HIP has no streamed matmul, no GEMM and no tensor-core attention: its backend
            // would refuse to start.
            assert!(
                !(device == Device::Hip
                    && (tuning.streamed_matmul || tuning.prompt_gemm || tuning.prompt_attention)),
                "hosts/{}.toml",
                profile.chip().name()
            );
        }
    }

    #[test]
    fn tuning_flags_override_the_profile_and_are_refused_for_the_cpu() {
        let r9700 = HostProfile::embedded("r9700").unwrap();
        let flags = TuningArgs {
            matvec_warps: Some(8),
            ..TuningArgs::default()
        };
        let tuning = flags.resolve(Some(&r9700), Device::Hip).unwrap();
        assert_eq!(tuning.matvec_warps, 8);
        assert_eq!(
            tuning.attention_warps,
            r9700.kernels().unwrap().attention_warps
        );
        assert_eq!(
            TuningArgs::default().resolve(None, Device::Cuda).unwrap(),
            GpuTuning::DEFAULT
        );
        let refused = flags.resolve(None, Device::Cpu).unwrap_err().to_string();
        assert!(refused.contains("not --device cpu"), "{refused}");
        // The flag overrides the profile's key either way.
        let rtx3090 = HostProfile::embedded("rtx3090").unwrap();
        let from_profile = rtx3090.kernels().unwrap().streamed_matmul.unwrap();
        let flipped = TuningArgs {
            streamed_matmul: Some(!from_profile),
            ..TuningArgs::default()
        };
        assert_eq!(
            flipped
                .resolve(Some(&rtx3090), Device::Cuda)
                .unwrap()
                .streamed_matmul,
            !from_profile
        );
        assert!(flipped.resolve(None, Device::Cpu).is_err());
        assert_eq!(
            TuningArgs {
                mmq_rows: Some(2),
                prompt_rows_from: Some(64),
                ..flipped
            }
            .to_args(),
            [
                "--mmq-rows",
                "2",
                "--prompt-rows-from",
                "64",
                "--streamed-matmul",
                &(!from_profile).to_string()
            ]
        );
        let from = TuningArgs {
            prompt_rows_from: Some(64),
            ..TuningArgs::default()
        };
        assert_eq!(
            from.resolve(Some(&rtx3090), Device::Cuda)
                .unwrap()
                .prompt_rows_from,
            64
        );
        assert!(from.resolve(None, Device::Cpu).is_err());
    }
}
