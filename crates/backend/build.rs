//! Compiles the GPU kernels (`kernels/cuda/*.cu`, one family per file, one source for CUDA and
//! HIP) for the GPU features that are on, and embeds them through `$OUT_DIR/*_kernels.rs`.
//! Without the compiler the list is empty and the backend says so when asked for a device.
//!
//! - `cuda`: nvcc (`$NVCC`, else `nvcc` on PATH) builds one fatbin per family and architecture,
//!   holding that architecture's cubin and its PTX. The architectures are
//!   `$LUCEBOX_CUDA_ARCHS`, comma-separated compute capabilities, `86,90,120` by default.
//! - `hip`: hipcc (`$HIPCC`, else `hipcc` on PATH) builds one code object per family and
//!   architecture (`--genco`). The architectures are `$LUCEBOX_HIP_ARCHS`, comma-separated gfx
//!   targets, `gfx1100,gfx1151,gfx1201` by default.
//!
//! A chip's package builds exactly its own architecture (flake.nix, from the host profile).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One GPU toolchain: how to find its compiler, name an architecture, and build an image.
struct Toolchain {
    /// The cargo feature that wants it.
    feature: &'static str,
    /// The variable naming the compiler, and the compiler's name on PATH.
    compiler_var: &'static str,
    compiler: &'static str,
    archs_var: &'static str,
    default_archs: &'static str,
    /// What the generated file is called and what its constants are prefixed with.
    name: &'static str,
    /// The families it does not build: `gemm`, `mmq`, `mmt` and `prompt_attention` are
    /// NVIDIA's tensor-core `mma.sync`, which RDNA does not have (its matrices take the matvec
    /// for any number of rows, its prompt rows `attention`).
    skips: &'static [&'static str],
}

const CUDA: Toolchain = Toolchain {
    feature: "CUDA",
    compiler_var: "NVCC",
    compiler: "nvcc",
    archs_var: "LUCEBOX_CUDA_ARCHS",
    default_archs: "86,90,120",
    name: "cuda",
    skips: &[],
};

const HIP: Toolchain = Toolchain {
    feature: "HIP",
    compiler_var: "HIPCC",
    compiler: "hipcc",
    archs_var: "LUCEBOX_HIP_ARCHS",
    default_archs: "gfx1100,gfx1151,gfx1201",
    name: "hip",
    skips: &["gemm", "mmq", "mmt", "prompt_attention"],
};

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels/cuda");
    for toolchain in [CUDA, HIP] {
        build(&toolchain, &kernels, &out);
    }
}

/// Writes `$OUT_DIR/<name>_kernels.rs`: `IMAGES` (the kernel images) and `COMPILER` (the
/// compiler that built them, `None` when there was none).
fn build(toolchain: &Toolchain, kernels: &Path, out: &Path) {
    println!("cargo:rerun-if-env-changed={}", toolchain.compiler_var);
    println!("cargo:rerun-if-env-changed={}", toolchain.archs_var);
    let mut images = String::new();
    let mut version = None;
    if std::env::var_os(format!("CARGO_FEATURE_{}", toolchain.feature)).is_some() {
        // The families include kernels/portable.cuh, above their own folder.
        println!("cargo:rerun-if-changed={}", kernels.join("..").display());
        let compiler =
            std::env::var(toolchain.compiler_var).unwrap_or_else(|_| toolchain.compiler.to_owned());
        match Command::new(&compiler).arg("--version").output() {
            Ok(output) if output.status.success() => {
                let text = String::from_utf8_lossy(&output.stdout);
                // nvcc ends with its build; hipcc starts with the HIP version, then clang's.
                version = text
                    .lines()
                    .find(|line| line.starts_with("HIP version"))
                    .or_else(|| text.lines().rfind(|line| !line.trim().is_empty()))
                    .map(|line| line.trim().to_owned());
                images = compile_all(toolchain, &compiler, kernels, out);
            }
            _ => println!(
                "cargo:warning={compiler} not found: the {} backend is built without kernels; set \
                 {} or put {} on PATH",
                toolchain.name, toolchain.compiler_var, toolchain.compiler
            ),
        }
    }
    let source = format!(
        "/// The kernel images built into this binary.\n\
         const IMAGES: &[KernelImage] = &[\n{images}];\n\
         /// The compiler that built them.\n\
         const COMPILER: Option<&str> = {version:?};\n"
    );
    let file = out.join(format!("{}_kernels.rs", toolchain.name));
    std::fs::write(&file, source).unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
}

/// Compiles every family for every architecture; returns the `KernelImage` entries.
fn compile_all(toolchain: &Toolchain, compiler: &str, kernels: &Path, out: &Path) -> String {
    let archs =
        std::env::var(toolchain.archs_var).unwrap_or_else(|_| toolchain.default_archs.to_owned());
    let mut families: Vec<PathBuf> = std::fs::read_dir(kernels)
        .expect("reading kernels/cuda")
        .map(|entry| entry.expect("reading kernels/cuda").path())
        .filter(|path| path.extension().is_some_and(|e| e == "cu"))
        .filter(|path| {
            let family = path.file_stem().and_then(|stem| stem.to_str());
            !family.is_some_and(|family| toolchain.skips.contains(&family))
        })
        .collect();
    families.sort();
    let mut images = String::new();
    for arch in archs.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        for source in &families {
            let family = source.file_stem().unwrap().to_str().unwrap();
            let (image, args) = if toolchain.name == "cuda" {
                let sm: u32 = arch.parse().unwrap_or_else(|_| {
                    panic!(
                        "{}: {arch:?} is not a compute capability like 86",
                        toolchain.archs_var
                    )
                });
                (
                    out.join(format!("{family}.sm_{sm}.fatbin")),
                    vec![
                        "--fatbin".to_owned(),
                        format!("-gencode=arch=compute_{sm},code=[sm_{sm},compute_{sm}]"),
                    ],
                )
            } else {
                assert!(
                    arch.starts_with("gfx") && arch[3..].chars().all(|c| c.is_ascii_alphanumeric()),
                    "{}: {arch:?} is not a gfx target like gfx1201",
                    toolchain.archs_var
                );
                (
                    out.join(format!("{family}.{arch}.hsaco")),
                    vec![
                        "--genco".to_owned(),
                        format!("--offload-arch={arch}"),
                        "-x".to_owned(),
                        "hip".to_owned(),
                    ],
                )
            };
            let status = Command::new(compiler)
                .args(["-O3", "-std=c++17"])
                .args(&args)
                .arg("-o")
                .arg(&image)
                .arg(source)
                .status()
                .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
            assert!(
                status.success(),
                "{compiler} failed on {} for {arch}",
                source.display()
            );
            writeln!(
                images,
                "    KernelImage {{ family: {family:?}, arch: {arch:?}, image: include_bytes!({:?}) }},",
                image.display().to_string()
            )
            .unwrap();
        }
    }
    images
}
