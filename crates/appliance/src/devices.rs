//! Which GPUs and runtimes a machine has, read from the kernel's files (no GPU library is
//! loaded, so this works in any build and on any machine), and which host profile they match.
//!
//! - AMD: each KFD topology node (`/sys/class/kfd/kfd/topology/nodes/N/properties`) with a
//!   non-zero `gfx_target_version` is a GPU; the version encodes the architecture (`120001` is
//!   gfx1201). ROCm's version is read from `<rocm>/.info/version`.
//! - NVIDIA: each `/proc/driver/nvidia/gpus/<bus>/information` is a GPU, with its model name;
//!   the driver's version is in `/proc/driver/nvidia/version`. The compute capability needs the
//!   CUDA driver API, so it is not known here.

use std::path::{Path, PathBuf};

use crate::{HostProfile, Runtime};

/// An AMD GPU known to the KFD driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmdGpu {
    /// The KFD topology node.
    pub node: u32,
    /// Its architecture, as compilers name it (`gfx1201`).
    pub gfx: String,
}

/// An NVIDIA GPU known to the NVIDIA driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvidiaGpu {
    /// Its PCI bus id.
    pub bus: String,
    /// Its model (`NVIDIA GeForce RTX 3090`).
    pub model: String,
}

/// What a machine has.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Devices {
    /// AMD GPUs, by node.
    pub amd: Vec<AmdGpu>,
    /// The ROCm installation's version, if one was found.
    pub rocm_version: Option<String>,
    /// NVIDIA GPUs, by bus.
    pub nvidia: Vec<NvidiaGpu>,
    /// The NVIDIA kernel driver's version line, if the driver is loaded.
    pub nvidia_driver: Option<String>,
}

impl Devices {
    /// Reads the machine below `root` (`/` on a real machine; a fake tree in tests). `rocm` is
    /// where ROCm is installed, if anywhere.
    pub fn probe(root: &Path, rocm: Option<&Path>) -> Devices {
        let read = |path: PathBuf| std::fs::read_to_string(path).ok();
        let mut amd: Vec<AmdGpu> = entries(&root.join("sys/class/kfd/kfd/topology/nodes"))
            .into_iter()
            .filter_map(|(name, path)| {
                let node = name.parse().ok()?;
                let properties = read(path.join("properties"))?;
                let version = properties.lines().find_map(|line| {
                    line.strip_prefix("gfx_target_version ")?
                        .trim()
                        .parse()
                        .ok()
                })?;
                Some(AmdGpu {
                    node,
                    gfx: gfx_name(version)?,
                })
            })
            .collect();
        amd.sort_by_key(|gpu| gpu.node);
        let rocm_version = rocm
            .and_then(|dir| read(dir.join(".info/version")))
            .map(|text| text.trim().to_owned())
            .filter(|version| !version.is_empty());
        let mut nvidia: Vec<NvidiaGpu> = entries(&root.join("proc/driver/nvidia/gpus"))
            .into_iter()
            .filter_map(|(bus, path)| {
                let information = read(path.join("information"))?;
                let model = information
                    .lines()
                    .find_map(|line| line.strip_prefix("Model:"))?
                    .trim()
                    .to_owned();
                Some(NvidiaGpu { bus, model })
            })
            .collect();
        nvidia.sort_by(|a, b| a.bus.cmp(&b.bus));
        let nvidia_driver = read(root.join("proc/driver/nvidia/version"))
            .and_then(|text| text.lines().next().map(|line| line.trim().to_owned()));
        Devices {
            amd,
            rocm_version,
            nvidia,
            nvidia_driver,
        }
    }

    /// Whether the machine has the GPU `profile` was tested on: an AMD GPU of exactly its
    /// architecture, or an NVIDIA GPU whose model the profile's description begins with (the
    /// compute capability needs the CUDA driver, so the model name stands in for it). A CPU
    /// profile needs none.
    pub fn has_gpu_for(&self, profile: &HostProfile) -> bool {
        match profile.chip().runtime() {
            Runtime::None => true,
            Runtime::Rocm => self
                .amd
                .iter()
                .any(|gpu| Some(gpu.gfx.as_str()) == profile.chip().kernel_target()),
            Runtime::Cuda => self.nvidia.iter().any(|gpu| {
                profile
                    .chip()
                    .description()
                    .strip_prefix(gpu.model.as_str())
                    .is_some_and(|rest| rest.starts_with(" ("))
            }),
        }
    }

    /// The profiles among `profiles` whose GPU this machine has; `cpu` when it has no GPU.
    pub fn tested_chips<'a>(&self, profiles: &'a [HostProfile]) -> Vec<&'a str> {
        let has_gpu = !self.amd.is_empty() || !self.nvidia.is_empty();
        profiles
            .iter()
            .filter(|profile| match profile.chip().runtime() {
                Runtime::None => !has_gpu,
                _ => self.has_gpu_for(profile),
            })
            .map(|profile| profile.chip().name())
            .collect()
    }

    /// Whether the ROCm found is the profile's major(.minor) version; `None` when either side
    /// has no ROCm to compare.
    pub fn rocm_matches(&self, profile: &HostProfile) -> Option<bool> {
        let wanted = profile
            .chip()
            .runtime_version()
            .filter(|_| profile.chip().runtime() == Runtime::Rocm)?;
        let found = self.rocm_version.as_deref()?;
        Some(
            found
                .strip_prefix(wanted)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '-'])),
        )
    }
}

/// The architecture name of a KFD `gfx_target_version` (major * 10000 + minor * 100 +
/// stepping): `120001` is gfx1201, `110501` gfx1151, `90010` gfx90a. Zero (a CPU node) is none.
pub fn gfx_name(target_version: u32) -> Option<String> {
    if target_version == 0 {
        return None;
    }
    let major = target_version / 10000;
    let minor = target_version / 100 % 100;
    let stepping = target_version % 100;
    (minor < 16 && stepping < 16).then(|| format!("gfx{major}{minor:x}{stepping:x}"))
}

/// The entries of `dir` as (name, path), none when it cannot be read.
fn entries(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    read.filter_map(Result::ok)
        .filter_map(|entry| Some((entry.file_name().into_string().ok()?, entry.path())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, relative: &str, text: &str) {
        let path = root.join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn all_profiles() -> Vec<HostProfile> {
        HostProfile::embedded_all().unwrap()
    }

    #[test]
    fn gfx_names_follow_the_compilers() {
        assert_eq!(gfx_name(120001).as_deref(), Some("gfx1201"));
        assert_eq!(gfx_name(110501).as_deref(), Some("gfx1151"));
        assert_eq!(gfx_name(110000).as_deref(), Some("gfx1100"));
        assert_eq!(gfx_name(90010).as_deref(), Some("gfx90a"));
        assert_eq!(gfx_name(0), None);
    }

    #[test]
    fn a_machine_without_gpus_has_none() {
        let root = tempfile::tempdir().unwrap();
        let devices = Devices::probe(root.path(), Some(&root.path().join("opt/rocm")));
        assert_eq!(devices, Devices::default());
        let cpu = HostProfile::embedded("cpu").unwrap();
        assert!(devices.has_gpu_for(&cpu));
        let r9700 = HostProfile::embedded("r9700").unwrap();
        assert!(!devices.has_gpu_for(&r9700));
        assert_eq!(devices.rocm_matches(&r9700), None);
        assert_eq!(devices.tested_chips(&all_profiles()), ["cpu"]);
    }

    #[test]
    fn amd_gpus_and_rocm_are_read_and_matched_to_profiles() {
        let root = tempfile::tempdir().unwrap();
        let nodes = "sys/class/kfd/kfd/topology/nodes";
        write(
            root.path(),
            &format!("{nodes}/0/properties"),
            "cpu_cores_count 16\ngfx_target_version 0\n",
        );
        write(
            root.path(),
            &format!("{nodes}/1/properties"),
            "simd_count 128\ngfx_target_version 120001\n",
        );
        write(root.path(), "opt/rocm/.info/version", "7.2.0-43\n");
        let devices = Devices::probe(root.path(), Some(&root.path().join("opt/rocm")));
        assert_eq!(
            devices.amd,
            [AmdGpu {
                node: 1,
                gfx: "gfx1201".into()
            }]
        );
        let r9700 = HostProfile::embedded("r9700").unwrap();
        let rx7900 = HostProfile::embedded("rx7900").unwrap();
        assert!(devices.has_gpu_for(&r9700));
        assert!(!devices.has_gpu_for(&rx7900));
        assert_eq!(devices.rocm_matches(&r9700), Some(true));
        assert_eq!(devices.rocm_matches(&rx7900), Some(false));
        assert_eq!(devices.tested_chips(&all_profiles()), ["r9700"]);
    }

    #[test]
    fn nvidia_gpus_and_the_driver_are_read() {
        let root = tempfile::tempdir().unwrap();
        write(
            root.path(),
            "proc/driver/nvidia/gpus/0000:01:00.0/information",
            "Model: \t\t NVIDIA GeForce RTX 3090\nIRQ:   140\n",
        );
        write(
            root.path(),
            "proc/driver/nvidia/version",
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.16\nGCC version: 13\n",
        );
        let devices = Devices::probe(root.path(), None);
        assert_eq!(devices.nvidia[0].model, "NVIDIA GeForce RTX 3090");
        assert!(
            devices
                .nvidia_driver
                .as_ref()
                .unwrap()
                .ends_with("570.86.16")
        );
        let profiles = all_profiles();
        assert_eq!(devices.tested_chips(&profiles), ["rtx3090"]);
        let mut ti = devices.clone();
        ti.nvidia[0].model.push_str(" Ti");
        assert!(ti.tested_chips(&profiles).is_empty());
    }
}
