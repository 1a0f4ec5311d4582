//! Compiles the CUDA kernels (`kernels/cuda/*.cu`, one family per file) when the `cuda` feature
//! is on and nvcc is found (`$NVCC`, else `nvcc` on PATH): one fatbin per family and
//! architecture, holding that architecture's cubin and its PTX. The architectures are
//! `$LUCEBOX_CUDA_ARCHS` (comma-separated compute capabilities, `86,90,120` by default; a chip's
//! package builds exactly its own). The images are embedded through `$OUT_DIR/cuda_kernels.rs`;
//! without nvcc the list is empty and the backend says so when asked for a device.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

const DEFAULT_ARCHS: &str = "86,90,120";

fn main() {
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=LUCEBOX_CUDA_ARCHS");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut images = String::new();
    let mut nvcc_version = None;
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels/cuda");
        // The families include kernels/portable.cuh, above their own folder.
        println!("cargo:rerun-if-changed={}", kernels.join("..").display());
        let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".to_owned());
        match Command::new(&nvcc).arg("--version").output() {
            Ok(output) if output.status.success() => {
                let text = String::from_utf8_lossy(&output.stdout);
                nvcc_version = text.lines().last().map(|line| line.trim().to_owned());
                images = compile_all(&nvcc, &kernels, &out);
            }
            _ => println!(
                "cargo:warning=nvcc not found ({nvcc}): the CUDA backend is built without kernels; \
                 set NVCC or put nvcc on PATH"
            ),
        }
    }
    let source = format!(
        "/// The kernel images built into this binary.\n\
         pub(crate) const IMAGES: &[KernelImage] = &[\n{images}];\n\
         /// The nvcc that built them.\n\
         pub(crate) const NVCC_VERSION: Option<&str> = {nvcc_version:?};\n"
    );
    std::fs::write(out.join("cuda_kernels.rs"), source).expect("writing cuda_kernels.rs");
}

/// Compiles every family for every architecture; returns the `KernelImage` entries.
fn compile_all(nvcc: &str, kernels: &Path, out: &Path) -> String {
    let archs = std::env::var("LUCEBOX_CUDA_ARCHS").unwrap_or_else(|_| DEFAULT_ARCHS.to_owned());
    let mut families: Vec<PathBuf> = std::fs::read_dir(kernels)
        .expect("reading kernels/cuda")
        .map(|entry| entry.expect("reading kernels/cuda").path())
        .filter(|path| path.extension().is_some_and(|e| e == "cu"))
        .collect();
    families.sort();
    let mut images = String::new();
    for arch in archs.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        let sm: u32 = arch.parse().unwrap_or_else(|_| {
            panic!("LUCEBOX_CUDA_ARCHS: {arch:?} is not a compute capability like 86")
        });
        for source in &families {
            let family = source.file_stem().unwrap().to_str().unwrap();
            let fatbin = out.join(format!("{family}.sm_{sm}.fatbin"));
            let status = Command::new(nvcc)
                .args(["-O3", "--fatbin", "-std=c++17"])
                .arg(format!(
                    "-gencode=arch=compute_{sm},code=[sm_{sm},compute_{sm}]"
                ))
                .arg("-o")
                .arg(&fatbin)
                .arg(source)
                .status()
                .unwrap_or_else(|e| panic!("running {nvcc}: {e}"));
            assert!(
                status.success(),
                "nvcc failed on {} for sm_{sm}",
                source.display()
            );
            writeln!(
                images,
                "    KernelImage {{ family: {family:?}, sm: {sm}, fatbin: include_bytes!({:?}) }},",
                fatbin.display().to_string()
            )
            .unwrap();
        }
    }
    images
}
