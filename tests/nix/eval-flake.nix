# Evaluates flake.nix's outputs with stand-in inputs and checks how they are wired: a package, an
# app and checks per chip, the wrapper's LUCEBOX_CHIP, the CUDA and HIP builds (features,
# architecture, toolchain), the model directories, one dependency build shared by the package and
# clippy, the source filter, the runtime checks, the overlay, and the nixosConfigurations
# (hosts/<chip>.nix with nix/appliance.nix). Run by tests/nix/check:
#
#   nix-instantiate --readonly-mode --eval --strict tests/nix/eval-flake.nix --arg lib 'import <nixpkgs.lib>/lib'
#
# The inputs are stand-ins (tests/nix/stand-in.nix): nixpkgs is nixpkgs.lib's lib with a stand-in
# `pkgs` and a `nixosSystem` that runs lib.evalModules over the typed stand-in of the NixOS options
# our modules set; crane's functions return attribute sets that keep their arguments. So this
# checks flake.nix's own logic, not that nixpkgs or crane accept it: nothing is built.
{ lib }:
let
  standIn = import ./stand-in.nix { inherit lib; };
  inherit (standIn) pkgs store expect;

  hosts = import ../../nix/hosts.nix { };
  chipNames = builtins.attrNames hosts.chips;
  gpuChipNames = builtins.filter (name: hosts.chips.${name}.vendor != "any") chipNames;
  cudaChipNames = builtins.filter (name: hosts.chips.${name}.vendor == "nvidia") chipNames;
  amdChipNames = builtins.filter (name: hosts.chips.${name}.vendor == "amd") chipNames;

  # crane's filterCargoSources (lib/filterCargoSources.nix of ipetkov/crane).
  filterCargoSources =
    path: type:
    type == "directory"
    || lib.any (suffix: lib.hasSuffix suffix (baseNameOf path)) [
      ".rs"
      ".toml"
    ]
    || baseNameOf path == "Cargo.lock";

  flakeWith =
    {
      rocm ? "7.2.2",
      rocm6 ? "6.4.3",
    }:
    let
      pkgsFor =
        system:
        pkgs
        // {
          stdenv.hostPlatform.system = system;
          rocmPackages = standIn.rocmPackages rocm;
        };
      inputs = {
        self = flake;
        nixpkgs = {
          # `import nixpkgs { ... }`, which flake.nix does for CUDA's unfree toolchain.
          outPath = ./stand-in-nixpkgs.nix;
          lib = lib // {
            nixosSystem =
              { modules }:
              lib.evalModules {
                modules = modules ++ [
                  standIn.nixos
                  { _module.args.pkgs = pkgsFor "x86_64-linux"; }
                ];
              };
          };
          legacyPackages = lib.genAttrs [ "x86_64-linux" "aarch64-linux" ] pkgsFor;
        };
        nixpkgs-rocm6.legacyPackages.x86_64-linux.rocmPackages = standIn.rocmPackages rocm6;
        crane.mkLib = _: {
          inherit filterCargoSources;
          buildDepsOnly = args: standIn.fakeDrv "lucebox-deps-${args.version}" { inherit args; };
          buildPackage =
            args:
            standIn.fakeDrv "lucebox-${args.version}" {
              inherit args;
              inherit (args) meta;
            };
          cargoClippy = args: standIn.fakeDrv "lucebox-clippy" { inherit args; };
          cargoFmt = args: standIn.fakeDrv "lucebox-fmt" { inherit args; };
        };
      };
      flake = (import ../../flake.nix).outputs inputs;
    in
    flake;

  flake = flakeWith { };
  packages = flake.packages.x86_64-linux;
  checks = flake.checks.x86_64-linux;
  version = (builtins.fromTOML (builtins.readFile ../../Cargo.toml)).workspace.package.version;
  binary = "${store}-lucebox-${version}/bin/lucebox";
  src = packages.cpu.unwrapped.args.src;

  nixos = name: flake.nixosConfigurations.${name}.config;
  vmMachine =
    (lib.evalModules {
      modules = [
        checks.vm-serve.test.nodes.machine
        standIn.nixos
        { _module.args.pkgs = pkgs; }
      ];
    }).config;
  failedAssertions = config: map (a: a.message) (lib.filter (a: !a.assertion) config.assertions);
in
[
  (expect "packages per chip, and the default" (builtins.attrNames packages) (
    lib.sort lib.lessThan (chipNames ++ [ "default" ])
  ))
  (expect "aarch64: the cpu chip only" (builtins.attrNames flake.packages.aarch64-linux) [
    "cpu"
    "default"
  ])
  (expect "default package is cpu" packages.default.chip "cpu")
  (expect "descriptions come from nix/hosts.nix" (map (name: packages.${name}.meta.description) chipNames) (
    map (name: hosts.chips.${name}.description) chipNames
  ))
  (expect "no GPU chip's package says it runs the CPU engine" (map (
    name: lib.hasInfix "CPU engine" packages.${name}.meta.description
  ) gpuChipNames) (map (_: false) gpuChipNames))
  (expect "the wrapper sets LUCEBOX_CHIP, and no driver path for the cpu and HIP binaries" (lib.all (
    name:
    lib.hasInfix "makeWrapper ${binary} $out/bin/lucebox --set LUCEBOX_CHIP ${name}\n" packages.${name}.script
  ) ([ "cpu" ] ++ amdChipNames)) true)
  (expect "the CUDA chips' wrapper also finds the driver's libcuda" (lib.all (
    name:
    lib.hasInfix "makeWrapper ${binary} $out/bin/lucebox --set LUCEBOX_CHIP ${name} --prefix LD_LIBRARY_PATH : /run/opengl-driver/lib\n" packages.${name}.script
  ) cudaChipNames) true)
  (expect "the CUDA chips: the CUDA backend, kernels for exactly their architecture" (map (name: {
    inherit (packages.${name}.unwrapped.args) cargoExtraArgs LUCEBOX_CUDA_ARCHS NVCC NVCC_CCBIN;
    deps = packages.${name}.unwrapped.args.cargoArtifacts.args.cargoExtraArgs;
  }) [ "rtx3090" "rtx5090" ]) (map (arch: {
    cargoExtraArgs = "--locked --package lucebox --features cuda";
    LUCEBOX_CUDA_ARCHS = arch;
    NVCC = "${store}-cuda_nvcc-12.9/bin/nvcc";
    NVCC_CCBIN = "${store}-gcc-wrapper-14/bin/c++";
    deps = "--locked --package lucebox --features cuda";
  }) [ "86" "120" ]))
  (expect "the AMD chips: the HIP backend, kernels for exactly their architecture, their ROCm's runtime"
    (map (
      name:
      let
        inherit (packages.${name}.unwrapped) args meta;
        deps = args.cargoArtifacts.args;
      in
      {
        inherit (args)
          cargoExtraArgs
          LUCEBOX_HIP_ARCHS
          HIP_PATH
          HIPCC
          ;
        inherit (meta) description;
        nativeBuildInputs = map (drv: drv.name) args.nativeBuildInputs;
        buildInputs = map (drv: drv.name) args.buildInputs;
        deps = {
          inherit (deps) cargoExtraArgs HIP_PATH HIPCC;
          buildInputs = map (drv: drv.name) deps.buildInputs;
          # One dependency build per toolchain, whatever the chip's architecture.
          archs = deps ? LUCEBOX_HIP_ARCHS;
        };
      }
    ) [ "r9700" "strix-halo" "rx7900" ])
    (lib.zipListsWith (
      arch: rocm:
      let
        clr = "${store}-clr-${rocm}";
      in
      {
        cargoExtraArgs = "--locked --package lucebox --features hip";
        LUCEBOX_HIP_ARCHS = arch;
        HIP_PATH = clr;
        HIPCC = "${clr}/bin/hipcc";
        description = "Lucebox speculative-decoding LLM server with the HIP backend for ${arch}";
        nativeBuildInputs = [ "clr-${rocm}" ];
        buildInputs = [ "clr-${rocm}" ];
        deps = {
          cargoExtraArgs = "--locked --package lucebox --features hip";
          HIP_PATH = clr;
          HIPCC = "${clr}/bin/hipcc";
          buildInputs = [ "clr-${rocm}" ];
          archs = false;
        };
      }
    ) [ "gfx1201" "gfx1151" "gfx1100" ] [ "7.2.2" "7.2.2" "6.4.3" ])
  )
  (expect "each AMD chip's toolchain is its profile's ROCm" (map (
    name: packages.${name}.gpuToolchain.rocm-core.version
  ) amdChipNames) (map (name: { "7.2" = "7.2.2"; "6" = "6.4.3"; }.${hosts.chips.${name}.profile.chip.runtime_version}) amdChipNames))
  (expect "the CUDA toolchain's import allows exactly CUDA's licence unfree" (
    let
      allowed = packages.rtx3090.gpuToolchain.importedWith.config.allowUnfreePredicate;
    in
    map allowed [
      { meta.license = { shortName = "CUDA EULA"; free = false; }; }
      { meta.license = [ { shortName = "CUDA EULA"; free = false; } ]; }
      { meta.license = { shortName = "unfree"; free = false; }; }
      { meta.license = [ { shortName = "CUDA EULA"; } { shortName = "unfree"; } ]; }
    ]
  ) [ true true false false ])
  (expect "the package carries its host profile" (lib.all (
    name: lib.hasInfix "$out/share/lucebox/hosts/${name}.toml" packages.${name}.script
  ) chipNames) true)
  (expect "mainProgram" packages.r9700.meta.mainProgram "lucebox")
  (expect "a model directory per pair" (builtins.attrNames packages.r9700.pairs) (
    builtins.attrNames hosts.chips.r9700.pairs
  ))
  (expect "the cargo package lucebox, Cargo.lock honoured" packages.cpu.unwrapped.args.cargoExtraArgs
    "--locked --package lucebox"
  )
  (expect "dependencies built once, for the package and clippy"
    packages.cpu.unwrapped.args.cargoArtifacts.outPath
    checks.clippy.args.cargoArtifacts.outPath
  )
  (expect "clippy as tests/run-all runs it" checks.clippy.args.cargoClippyExtraArgs
    "--workspace --all-targets -- --deny warnings"
  )
  (expect "the source filter keeps kernels, profiles, Rust; drops the rest"
    (map (path: src.filter path "regular") [
      "/src/kernels/norm.cu"
      "/src/kernels/norm.cuh"
      "/src/kernels/norm.hip"
      "/src/hosts/r9700.toml"
      "/src/tests/bench/spec-prompts.toml"
      "/src/crates/lucebox/src/main.rs"
      "/src/Cargo.lock"
      "/src/README.md"
      "/src/tests/nix/check"
    ])
    [
      true
      true
      true
      true
      true
      true
      true
      false
      false
    ]
  )
  (expect "apps per chip, and the default" (builtins.attrNames flake.apps.x86_64-linux) (
    lib.sort lib.lessThan (chipNames ++ [ "default" ])
  ))
  (expect "nix run .#r9700: lucebox serve with its default pair's models" flake.apps.x86_64-linux.r9700.program
    "${
      standIn.scriptBin "lucebox-serve-r9700" ''
        export LUCEBOX_MODEL_DIR=${store}-lucebox-models-${hosts.chips.r9700.defaultPair.name}
        exec ${store}-lucebox-r9700-${version}/bin/lucebox serve "$@"
      ''
    }/bin/lucebox-serve-r9700"
  )
  (expect "checks: clippy, fmt, every package, runtime, configuration, VM test"
    (builtins.attrNames checks)
    (
      lib.sort lib.lessThan (
        [
          "clippy"
          "fmt"
          "vm-rollback"
          "vm-serve"
        ]
        ++ map (name: "package-${name}") chipNames
        ++ map (name: "nixos-${name}") chipNames
        ++ map (name: "runtime-${name}") gpuChipNames
      )
    )
  )
  (expect "aarch64 checks" (builtins.attrNames flake.checks.aarch64-linux) [
    "clippy"
    "fmt"
    "package-cpu"
  ])
  (expect "a package check only evaluates" checks.package-r9700.script
    "echo ${store}-lucebox-r9700-${version}.drv > $out\n"
  )
  (expect "runtime checks name what the locked nixpkgs has" (map (name: checks."runtime-${name}".script) [
    "r9700"
    "rx7900"
    "rtx5090"
  ]) [ "echo 'rocm 7.2.2' > $out\n" "echo 'rocm 6.4.3' > $out\n" "echo 'cuda 12.9' > $out\n" ])
  (expect "a runtime check fails when nixpkgs moves on"
    (builtins.tryEval (flakeWith { rocm = "7.3.0"; }).checks.x86_64-linux.runtime-r9700.script).success
    false
  )
  (expect "the VM test's machine: the cpu package, the smallest model, no gate" {
    inherit (vmMachine.systemd.services.lucebox.serviceConfig) ExecStart;
    inherit (vmMachine.services.lucebox.settings) model draft;
    gate = vmMachine.systemd.services ? lucebox-health-gate;
    failed = failedAssertions vmMachine;
  } {
    ExecStart = "${store}-lucebox-cpu-${version}/bin/lucebox serve --config ${store}-lucebox.toml";
    model = "${store}-lucebox-models-custom/smollm2-135m-instruct-q4_1.gguf";
    draft = "ngram";
    gate = false;
    failed = [ ];
  })
  (expect "overlay: pkgs.lucebox.<chip>"
    (builtins.attrNames (flake.overlays.default { stdenv.hostPlatform.system = "x86_64-linux"; } { }).lucebox)
    chipNames
  )
  (expect "a configuration per chip" (builtins.attrNames flake.nixosConfigurations) chipNames)
  (expect "configurations serve their chip with the flake's package" (map (
    name: (nixos name).systemd.services.lucebox.serviceConfig.ExecStart
  ) chipNames) (map (name: "${store}-lucebox-${name}-${version}/bin/lucebox serve --config ${store}-lucebox.toml") chipNames))
  (expect "configurations pass their assertions" (map (name: failedAssertions (nixos name)) chipNames) (
    map (_: [ ]) chipNames
  ))
  (expect "configurations warn that the hardware configuration is missing" (lib.all (
    name: lib.any (lib.hasInfix "hosts/hardware-configuration.nix is missing") (nixos name).warnings
  ) chipNames) true)
  (expect "placeholder: no boot loader" (nixos "cpu").boot.loader.grub.enable false)
  (expect "amd: amdgpu" [
    (nixos "r9700").hardware.amdgpu.initrd.enable
    (nixos "strix-halo").hardware.amdgpu.initrd.enable
    (nixos "rx7900").hardware.amdgpu.initrd.enable
    (nixos "rtx3090").hardware.amdgpu.initrd.enable
  ] [ true true true false ])
  (expect "nvidia: the open driver" [
    (nixos "rtx5090").services.xserver.videoDrivers
    (nixos "rtx5090").hardware.nvidia.open
    (nixos "r9700").services.xserver.videoDrivers
  ] [ [ "nvidia" ] true [ ] ])
  (expect "nvidia: only the driver is allowed unfree" (map (nixos "rtx3090").nixpkgs.config.allowUnfreePredicate [
    { pname = "nvidia-x11"; }
    { pname = "cudatoolkit"; }
  ]) [ true false ])
  (expect "cpu: no GPU driver" [
    (nixos "cpu").hardware.graphics.enable
    (nixos "cpu").services.xserver.videoDrivers
  ] [ false [ ] ])
]
