//! `lucebox doctor`: what this machine has, what the chip profile expects, and whether they
//! agree.

use std::path::{Path, PathBuf};

use anyhow::bail;
use clap::Args;
use lucebox_appliance::{
    Catalogue, DEFAULT_CHIP, Devices, HostProfile, PairDrafter, Presence, Runtime, model_dir,
    model_path,
};
use lucebox_backend::Backend;

/// Flags of `lucebox doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The host profile to check the machine against [default: cpu].
    #[arg(long, env = "LUCEBOX_CHIP")]
    chip: Option<String>,
    /// Read the machine's files below this directory instead of `/` (for tests).
    #[arg(long, hide = true, default_value = "/")]
    sysroot: PathBuf,
}

/// Prints the report; fails when the profile's own backend cannot run here.
pub fn run(args: DoctorArgs) -> anyhow::Result<()> {
    let chip = args.chip.as_deref().unwrap_or(DEFAULT_CHIP);
    let profile = HostProfile::embedded(chip)?;
    println!("lucebox {}", env!("CARGO_PKG_VERSION"));
    let cpu = cpu_model(&args.sysroot).unwrap_or_else(|| "unknown model".to_owned());
    let backend = crate::load::cpu_backend(None)?;
    println!("cpu: {cpu}; engine {}", backend.describe());
    println!(
        "profile: {} ({}); engine backend: {}",
        profile.chip().name(),
        profile.chip().description(),
        profile.engine().backend.name()
    );

    let rocm = rocm_dir(&args.sysroot);
    let devices = Devices::probe(&args.sysroot, rocm.as_deref());
    report_devices(&devices);

    let mut problems = Vec::new();
    let gpu_found = devices.has_gpu_for(&profile);
    if profile.is_cpu_stand_in() {
        let backend = match profile.chip().runtime() {
            Runtime::Cuda => "CUDA",
            _ => "HIP",
        };
        println!("note: the {backend} backend is not built yet; this package runs the CPU engine");
    } else if !gpu_found {
        let wanted = profile.chip().kernel_target().unwrap_or_default();
        problems.push(format!(
            "no GPU for this profile's kernels ({wanted}) was found"
        ));
    }
    if devices.rocm_matches(&profile) == Some(false) {
        problems.push(format!(
            "ROCm {} is installed, the profile was built for ROCm {}",
            devices.rocm_version.as_deref().unwrap_or_default(),
            profile.chip().runtime_version().unwrap_or_default()
        ));
    }
    report_models(&profile)?;
    if !problems.is_empty() {
        bail!("{}", problems.join("; "));
    }
    println!(
        "ok: this machine can serve the {} profile",
        profile.chip().name()
    );
    Ok(())
}

fn report_devices(devices: &Devices) {
    if devices.amd.is_empty() {
        println!("amd gpu: none (no GPU node under /sys/class/kfd)");
    }
    for gpu in &devices.amd {
        let profiles: Vec<&str> = HostProfile::embedded_names()
            .filter(|name| {
                HostProfile::embedded(name)
                    .is_ok_and(|p| p.chip().kernel_target() == Some(gpu.gfx.as_str()))
            })
            .collect();
        let profiles = match profiles.as_slice() {
            [] => "no profile".to_owned(),
            names => format!("profile {}", names.join(", ")),
        };
        println!("amd gpu: node {} is {} ({profiles})", gpu.node, gpu.gfx);
    }
    match &devices.rocm_version {
        Some(version) => println!("rocm: {version}"),
        None if !devices.amd.is_empty() => println!("rocm: not found ($ROCM_PATH, /opt/rocm)"),
        None => {}
    }
    if devices.nvidia.is_empty() {
        println!("nvidia gpu: none (no /proc/driver/nvidia/gpus)");
    }
    for gpu in &devices.nvidia {
        println!("nvidia gpu: {} at {}", gpu.model, gpu.bus);
    }
    if let Some(driver) = &devices.nvidia_driver {
        println!("nvidia driver: {driver}");
    }
}

/// Whether each model of each pair is in the model directory.
fn report_models(profile: &HostProfile) -> anyhow::Result<()> {
    let catalogue = Catalogue::embedded()?;
    let dir = model_dir()?;
    println!("models: {}", dir.display());
    for pair in profile.pairs() {
        let mut names = vec![pair.target()];
        if let PairDrafter::Model(drafter) = pair.drafter() {
            names.push(drafter);
        }
        let states: Vec<String> = names
            .iter()
            .map(|name| {
                let model = catalogue.model(name)?;
                let state = match Presence::of(&model_path(&dir, name), model.bytes())? {
                    Presence::Present => "present",
                    Presence::Absent => "absent (fetched on first serve)",
                    Presence::WrongSize { .. } => "wrong size (fetched again on first serve)",
                };
                Ok(format!("{name} {state}"))
            })
            .collect::<anyhow::Result<_>>()?;
        let default = if pair.is_default() { " (default)" } else { "" };
        println!("pair {}{default}: {}", pair.name(), states.join(", "));
    }
    Ok(())
}

/// The CPU's model name from /proc/cpuinfo.
fn cpu_model(root: &Path) -> Option<String> {
    let text = std::fs::read_to_string(root.join("proc/cpuinfo")).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("model name")?.split_once(':'))
        .map(|(_, name)| name.trim().to_owned())
}

/// Where ROCm is installed: `$ROCM_PATH`, else `/opt/rocm` when it exists.
fn rocm_dir(root: &Path) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("ROCM_PATH").filter(|p| !p.is_empty()) {
        return Some(
            root.join(
                Path::new(&path)
                    .strip_prefix("/")
                    .unwrap_or(Path::new(&path)),
            ),
        );
    }
    let default = root.join("opt/rocm");
    default.is_dir().then_some(default)
}
