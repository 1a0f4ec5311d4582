//! `lucebox doctor`: what this machine has, what the chip profile expects, and whether they
//! agree.

use std::path::{Path, PathBuf};

use std::collections::HashMap;

use anyhow::{Context, bail};
use clap::Args;
use lucebox_appliance::{
    Catalogue, DEFAULT_CHIP, Devices, HostProfile, PairDrafter, Presence, Runtime, model_dir,
    model_path, sha256_file,
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

/// Prints the report; fails when the profile's own backend cannot run here, the runtime is
/// another version, or a model file is corrupt.
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

    // The three checks a user would otherwise make by hand: is this a tested chip, does the
    // installed package target it, and do the pair's files verify.
    let mut problems = Vec::new();
    let profiles = HostProfile::embedded_all()?;
    let tested = devices.tested_chips(&profiles);
    match tested.as_slice() {
        [] => println!("tested chip: no; no host profile matches this machine's GPUs"),
        names => println!("tested chip: yes ({})", names.join(", ")),
    }
    let chip = profile.chip().name();
    let not_this = format!("the package is built for {chip}, which this machine is not");
    if tested.contains(&chip) {
        println!("package: built for {chip}, which this machine is");
    } else if profile.chip().runtime() == Runtime::None {
        println!("package: built for cpu, which runs anywhere");
    } else if profile.is_cpu_stand_in() {
        println!("note: {not_this}");
    } else {
        problems.push(not_this);
    }
    let backend = profile.engine().backend.name().to_uppercase();
    if profile.is_cpu_stand_in() {
        println!("note: this profile runs the CPU engine, not the chip's own backend");
    }
    let device = crate::load::Device::of_profile(&profile);
    if device != crate::load::Device::Cpu {
        match engine(device, &profile) {
            Ok(engine) => println!("engine: {engine}"),
            Err(why) => problems.push(format!(
                "the profile's {backend} engine cannot start: {why:#}"
            )),
        }
    }
    if devices.rocm_matches(&profile) == Some(false) {
        problems.push(format!(
            "ROCm {} is installed, the profile was built for ROCm {}",
            devices.rocm_version.as_deref().unwrap_or_default(),
            profile.chip().runtime_version().unwrap_or_default()
        ));
    }
    problems.extend(verify_models(&profile)?);
    if !problems.is_empty() {
        bail!("{}", problems.join("; "));
    }
    println!(
        "ok: this machine can serve the {} profile",
        profile.chip().name()
    );
    Ok(())
}

/// The description of `device`'s backend, tuned as `profile` says, or why it cannot start.
fn engine(device: crate::load::Device, profile: &HostProfile) -> anyhow::Result<String> {
    let tuning = crate::load::TuningArgs::default().resolve(Some(profile), device)?;
    crate::load::on_device!(device, None, tuning, |backend| Ok(backend.describe()))
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

/// Reports each pair's files, hashing those present against their pinned sha256; returns a
/// problem for each file that does not verify.
fn verify_models(profile: &HostProfile) -> anyhow::Result<Vec<String>> {
    let catalogue = Catalogue::embedded()?;
    let dir = model_dir()?;
    println!("models: {}", dir.display());
    let mut verdicts: HashMap<&str, &'static str> = HashMap::new();
    let mut problems = Vec::new();
    for pair in profile.pairs() {
        let mut names = vec![pair.target()];
        if let PairDrafter::Model(drafter) = pair.drafter() {
            names.push(drafter);
        }
        let mut states = Vec::new();
        for name in names {
            if !verdicts.contains_key(name) {
                let model = catalogue.model(name)?;
                let path = model_path(&dir, name);
                let verdict = match Presence::of(&path, model.bytes())? {
                    Presence::Absent => "absent (fetched on first serve)",
                    Presence::WrongSize { .. } => "wrong size (fetched again on first serve)",
                    Presence::Present => {
                        let sha256 = sha256_file(&path)
                            .with_context(|| format!("hashing {}", path.display()))?;
                        if sha256 == model.sha256() {
                            "verified (sha256)"
                        } else {
                            problems.push(format!(
                                "{} does not match its pinned sha256: delete it to fetch it again",
                                path.display()
                            ));
                            "CORRUPT (sha256 differs)"
                        }
                    }
                };
                verdicts.insert(name, verdict);
            }
            states.push(format!("{name} {}", verdicts[name]));
        }
        let default = if pair.is_default() { " (default)" } else { "" };
        println!("pair {}{default}: {}", pair.name(), states.join(", "));
    }
    Ok(problems)
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
