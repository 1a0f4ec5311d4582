{
  description = "Lucebox: a speculative-decoding LLM inference server, one package per chip of hosts/*.toml";

  inputs = {
    # Rust >= 1.95 (Cargo.toml's rust-version), ROCm 7.2 (r9700: gfx1201, strix-halo: gfx1151) and
    # cudaPackages_12 (rtx3090: sm_86, rtx5090: sm_120); checks.runtime-<chip> holds it to that.
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";
    # ROCm 6 for the rx7900 (gfx1100): NixOS 25.11, the last release before rocmPackages 7.
    nixpkgs-rocm6.url = "github:NixOS/nixpkgs/nixos-25.11";
    # The Rust build: honours Cargo.lock and builds the dependencies once. crane has no inputs of
    # its own, so there is nothing to follow: it builds with the nixpkgs given to crane.mkLib.
    crane.url = "github:ipetkov/crane";
  };

  outputs =
    {
      self,
      nixpkgs,
      nixpkgs-rocm6,
      crane,
    }:
    let
      inherit (nixpkgs) lib;

      # The chips, their pairs and the models, from hosts/*.toml (builtins only).
      hosts = import ./nix/hosts.nix { };

      # The GPU chips' machines are x86-64 (nixpkgs' ROCm is x86_64-linux only); the cpu chip's
      # package builds for aarch64 too.
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      chipsOn =
        system:
        if system == "x86_64-linux" then
          hosts.chips
        else
          lib.filterAttrs (_: chip: chip.vendor == "any") hosts.chips;

      version = (builtins.fromTOML (builtins.readFile ./Cargo.toml)).workspace.package.version;

      perSystem =
        system:
        let
          pkgs = nixpkgs.legacyPackages.${system};
          craneLib = crane.mkLib pkgs;
          modelFiles = import ./nix/models.nix { inherit (pkgs) fetchurl linkFarm; };

          # What the build reads: crane's Cargo sources (*.rs, Cargo.lock and every *.toml, among
          # them hosts/*.toml and tests/bench/spec-prompts.toml, which the crates embed with
          # include_str!) and the GPU kernels' sources.
          src = lib.cleanSourceWith {
            src = ./.;
            name = "lucebox-source";
            filter =
              path: type:
              craneLib.filterCargoSources path type || builtins.match ".*\\.(cu|cuh|hip)" path != null;
          };

          commonArgs = {
            inherit src version;
            pname = "lucebox";
            strictDeps = true;
            cargoExtraArgs = "--locked";
            # The tests need model files and the Python references: tests/run-all runs them.
            doCheck = false;
          };

          # The workspace's dependencies, built once, for the package and for clippy.
          cargoArtifacts = craneLib.buildDepsOnly commonArgs;

          lucebox = craneLib.buildPackage (
            commonArgs
            // {
              inherit cargoArtifacts;
              cargoExtraArgs = "--locked --package lucebox";
              meta = {
                description = "Lucebox speculative-decoding LLM server (the binary, no chip)";
                license = lib.licenses.asl20;
                mainProgram = "lucebox";
              };
            }
          );

          # CUDA's licence (NVIDIA's CUDA EULA) is unfree, so the CUDA toolchain comes from nixpkgs
          # imported again with exactly the packages under that licence allowed.
          cudaNixpkgs = import nixpkgs {
            inherit system;
            config.allowUnfreePredicate =
              pkg:
              lib.all (license: license.shortName or null == "CUDA EULA") (lib.toList (pkg.meta.license or [ ]));
          };

          # The GPU toolchains, by [chip] runtime and runtime_version of hosts/<chip>.toml.
          gpuToolchains = {
            cuda."12" = cudaNixpkgs.cudaPackages_12;
            rocm."7.2" = pkgs.rocmPackages;
            rocm."6" = nixpkgs-rocm6.legacyPackages.${system}.rocmPackages;
          };
          toolchainOf =
            chip:
            let
              inherit (chip.profile.chip) runtime;
            in
            if runtime == "none" then
              null
            else
              gpuToolchains.${runtime}.${chip.profile.chip.runtime_version}
                or (throw "hosts/${chip.name}.toml: no ${runtime} ${chip.profile.chip.runtime_version} toolchain in flake.nix's gpuToolchains");
          toolchainVersion =
            runtime: toolchain:
            {
              cuda = toolchain.cudaMajorMinorVersion;
              rocm = toolchain.rocm-core.version;
            }
            .${runtime};

          # The CUDA chips' binary: --features cuda, whose crates/backend/build.rs compiles
          # kernels/cuda/ with the toolchain's nvcc for exactly the chip's architecture
          # (LUCEBOX_CUDA_ARCHS), through the host compiler that CUDA release supports
          # (backendStdenv). The dependencies are built once for every CUDA chip.
          cudaCargoArgs = "--locked --package lucebox --features cuda";
          cudaArtifacts = craneLib.buildDepsOnly (commonArgs // { cargoExtraArgs = cudaCargoArgs; });
          luceboxCuda =
            chip: toolchain:
            craneLib.buildPackage (
              commonArgs
              // {
                cargoArtifacts = cudaArtifacts;
                cargoExtraArgs = cudaCargoArgs;
                nativeBuildInputs = [ toolchain.cuda_nvcc ];
                # cuda_fp16.h and the runtime headers nvcc includes.
                buildInputs = [ toolchain.cuda_cudart ];
                NVCC = "${toolchain.cuda_nvcc}/bin/nvcc";
                NVCC_CCBIN = "${toolchain.backendStdenv.cc}/bin/c++";
                LUCEBOX_CUDA_ARCHS = lib.removePrefix "sm_" chip.profile.chip.kernel_target;
                meta = lucebox.meta // {
                  description = "Lucebox speculative-decoding LLM server with the CUDA backend for ${chip.profile.chip.kernel_target}";
                };
              }
            );

          # The AMD chips' binary: --features hip, whose crates/backend/build.rs compiles
          # kernels/cuda/ with the toolchain's hipcc for exactly the chip's architecture
          # (LUCEBOX_HIP_ARCHS). hip-sys finds the HIP runtime's headers and libamdhip64 under
          # HIP_PATH and links that library, so the dependencies are built once per ROCm release
          # of gpuToolchains, for every chip on that release whatever its architecture.
          hipCargoArgs = "--locked --package lucebox --features hip";
          hipArgs =
            toolchain:
            commonArgs
            // {
              cargoExtraArgs = hipCargoArgs;
              # clr is the HIP runtime: headers, libamdhip64, and the wrapped hipcc and hipconfig
              # (with the toolchain's clang and device libraries) that the build runs.
              nativeBuildInputs = [ toolchain.clr ];
              buildInputs = [ toolchain.clr ];
              HIP_PATH = "${toolchain.clr}";
              HIPCC = "${toolchain.clr}/bin/hipcc";
            };
          hipArtifacts = toolchain: craneLib.buildDepsOnly (hipArgs toolchain);
          luceboxHip =
            chip: toolchain:
            craneLib.buildPackage (
              hipArgs toolchain
              // {
                cargoArtifacts = hipArtifacts toolchain;
                LUCEBOX_HIP_ARCHS = chip.profile.chip.kernel_target;
                meta = lucebox.meta // {
                  description = "Lucebox speculative-decoding LLM server with the HIP backend for ${chip.profile.chip.kernel_target}";
                };
              }
            );

          # One chip's package: the binary of its profile's [engine] backend, built with the
          # chip's gpuToolchain, wrapped to name the chip, with the profile. The CUDA chips'
          # binary finds the NVIDIA driver's libcuda where NixOS puts it (cudarc opens it at run
          # time). The HIP chips' binary needs no such path: it links the toolchain's HIP runtime
          # by rpath, and that runtime reaches the GPU through the amdgpu kernel driver's
          # /dev/kfd and /dev/dri (modules/lucebox.nix grants the service those).
          chipPackage =
            name: chip:
            let
              inherit (chip.profile.engine) backend;
              binary =
                {
                  cpu = lucebox;
                  cuda = luceboxCuda chip (toolchainOf chip);
                  hip = luceboxHip chip (toolchainOf chip);
                }
                .${backend}
                  or (throw "hosts/${name}.toml: [engine] backend = \"${backend}\", which flake.nix cannot build yet: add its build beside luceboxCuda and luceboxHip");
              driverPath = lib.optionalString (
                backend == "cuda"
              ) " --prefix LD_LIBRARY_PATH : ${pkgs.addDriverRunpath.driverLink}/lib";
            in
            pkgs.runCommand "lucebox-${name}-${version}"
              {
                nativeBuildInputs = [ pkgs.makeWrapper ];
                passthru = {
                  chip = name;
                  # The profile as nix/hosts.nix reads it, and a model directory per pair.
                  profile = chip;
                  pairs = lib.mapAttrs (_: modelFiles.pairDir) chip.pairs;
                  gpuToolchain = toolchainOf chip;
                  unwrapped = binary;
                };
                meta = binary.meta // {
                  inherit (chip) description;
                };
              }
              ''
                makeWrapper ${lib.getExe binary} $out/bin/lucebox --set LUCEBOX_CHIP ${lib.escapeShellArg name}${driverPath}
                install -D --mode=444 ${chip.file} $out/share/lucebox/hosts/${name}.toml
              '';

          chipPackages = lib.mapAttrs chipPackage (chipsOn system);

          # `nix run .#<chip>`: `lucebox serve` on the chip's default pair, with its models fetched
          # at build time.
          chipApp =
            name: package:
            let
              pairName = hosts.chips.${name}.defaultPair.name;
              serve = pkgs.writeShellScriptBin "lucebox-serve-${name}" ''
                export LUCEBOX_MODEL_DIR=${package.pairs.${pairName}}
                exec ${lib.getExe package} serve "$@"
              '';
            in
            {
              type = "app";
              program = lib.getExe serve;
              meta.description = "lucebox serve for ${name}: the pair ${pairName}, models fetched at build time";
            };

          # A check that a derivation evaluates (its .drv is computed), without building it.
          evaluated =
            name: drv:
            pkgs.runCommand "evaluated-${name}" { } ''
              echo ${builtins.unsafeDiscardStringContext drv.drvPath} > $out
            '';

          # A check that the locked nixpkgs still carries the runtime a GPU profile names.
          runtimeCheck =
            name: chip:
            let
              inherit (chip.profile.chip) runtime runtime_version;
              found = toolchainVersion runtime (toolchainOf chip);
            in
            assert lib.assertMsg (lib.hasPrefix "${runtime_version}." "${found}.")
              "hosts/${name}.toml names ${runtime} ${runtime_version}, but the locked nixpkgs has ${found}";
            pkgs.runCommand "runtime-${name}" { } ''
              echo ${lib.escapeShellArg "${runtime} ${found}"} > $out
            '';

          vmTests = lib.mapAttrs' (
            file: _:
            lib.nameValuePair (lib.removeSuffix ".nix" file) (
              pkgs.testers.runNixOSTest (
                import (./tests/nix + "/${file}") {
                  luceboxModule = ./modules/lucebox.nix;
                  package = chipPackages.cpu;
                  inherit hosts;
                }
              )
            )
          ) (lib.filterAttrs (file: type: type == "regular" && lib.hasPrefix "vm-" file && lib.hasSuffix ".nix" file) (builtins.readDir ./tests/nix));
        in
        {
          packages = chipPackages // {
            default = chipPackages.cpu;
          };

          apps =
            lib.mapAttrs chipApp chipPackages
            // {
              default = chipApp "cpu" chipPackages.cpu;
            };

          # Generated from the packages and configurations, so that none is skipped silently.
          checks = {
            clippy = craneLib.cargoClippy (
              commonArgs
              // {
                inherit cargoArtifacts;
                cargoClippyExtraArgs = "--workspace --all-targets -- --deny warnings";
              }
            );
            fmt = craneLib.cargoFmt { inherit src version; pname = "lucebox"; };
          }
          // lib.mapAttrs' (name: package: lib.nameValuePair "package-${name}" (evaluated name package)) chipPackages
          // lib.mapAttrs' (name: chip: lib.nameValuePair "runtime-${name}" (runtimeCheck name chip)) (
            lib.filterAttrs (_: chip: chip.profile.chip.runtime != "none") (chipsOn system)
          )
          // lib.optionalAttrs (system == "x86_64-linux") (
            lib.mapAttrs' (
              name: configuration:
              lib.nameValuePair "nixos-${name}" (evaluated "nixos-${name}" configuration.config.system.build.toplevel)
            ) self.nixosConfigurations
            // vmTests
          );
        };

      bySystem = lib.genAttrs systems perSystem;
    in
    {
      packages = lib.mapAttrs (_: outputs: outputs.packages) bySystem;
      apps = lib.mapAttrs (_: outputs: outputs.apps) bySystem;
      checks = lib.mapAttrs (_: outputs: outputs.checks) bySystem;

      # pkgs.lucebox.<chip>: this flake's packages (built with its own nixpkgs).
      overlays.default = final: _prev: {
        lucebox = removeAttrs (self.packages.${final.stdenv.hostPlatform.system} or { }) [ "default" ];
      };

      # services.lucebox, with the package of services.lucebox.chip from this flake.
      nixosModules.default =
        {
          config,
          lib,
          pkgs,
          ...
        }:
        let
          inherit (config.services.lucebox) chip;
          inherit (pkgs.stdenv.hostPlatform) system;
        in
        {
          imports = [ ./modules/lucebox.nix ];
          services.lucebox.package = lib.mkDefault (
            self.packages.${system}.${chip} or (throw "this flake has no lucebox package for chip ${chip} on ${system}")
          );
        };

      # `nixos-rebuild switch --flake .#<chip>`: hosts/<chip>.nix for every chip that has one.
      nixosConfigurations = lib.mapAttrs (
        name: _:
        lib.nixosSystem {
          modules = [
            self.nixosModules.default
            (./hosts + "/${name}.nix")
            { nixpkgs.hostPlatform = "x86_64-linux"; }
          ];
        }
      ) (lib.filterAttrs (name: _: builtins.pathExists (./hosts + "/${name}.nix")) hosts.chips);
    };
}
