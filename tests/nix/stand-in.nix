# Stand-ins for what tests/nix/eval-*.nix cannot have where they run (nixpkgs is 4 GB and cannot
# be fetched there; nixpkgs.lib can), and their check helpers:
#   pkgs     a small stand-in: derivations are attribute sets with fake store paths that keep
#            their arguments, so a test can look at what would be built (tests/nix/fake-drv.nix;
#            the CUDA packages flake.nix imports nixpkgs for are in stand-in-nixpkgs.nix; a
#            ROCm release's packages come from `rocmPackages <version>`)
#   nixos    a module declaring, with their types, the NixOS options our modules set; a misspelt
#            option or a value of the wrong type fails as it would in NixOS
#   expect   a check: its name when the value is the expected one, else an error showing both
# Nothing here is built or run.
{ lib }:
let
  inherit (lib) mkOption types;

  inherit (import ./fake-drv.nix) store fakeDrv;

  option = type: default: mkOption { inherit type default; };

  # A script's fake store path names the hash of its text, so a test can compare scripts by path.
  scriptBin = name: text: "/nix/store/${builtins.hashString "sha256" text}-${name}";

  hosts = import ../../nix/hosts.nix { };

  # A ROCm release's package set: its version (rocm-core) and the HIP runtime, clr, whose
  # store path names the release so that a test can tell which toolchain a build uses.
  rocmPackages = version: {
    rocm-core.version = version;
    clr = fakeDrv "clr-${version}" { };
  };
in
{
  inherit store fakeDrv scriptBin rocmPackages;

  expect =
    name: actual: expected:
    if actual == expected then
      name
    else
      throw "FAIL ${name}:\n  got      ${builtins.toJSON actual}\n  expected ${builtins.toJSON expected}";

  pkgs = {
    stdenv.hostPlatform.system = "x86_64-linux";
    lucebox = lib.mapAttrs (
      chip: _:
      fakeDrv "lucebox-${chip}" {
        inherit chip;
        meta.mainProgram = "lucebox";
      }
    ) hosts.chips;
    fetchurl =
      {
        name,
        url,
        sha256,
      }:
      fakeDrv name { inherit url sha256; };
    linkFarm = name: entries: fakeDrv name { inherit entries; };
    runCommand =
      name: attrs: script:
      fakeDrv name (attrs // attrs.passthru or { } // { inherit script; });
    writeShellScriptBin =
      name: text:
      {
        type = "derivation";
        outPath = scriptBin name text;
        meta.mainProgram = name;
      };
    makeWrapper = fakeDrv "make-wrapper" { };
    curl = fakeDrv "curl" { };
    util-linux = fakeDrv "util-linux" { };
    testers.runNixOSTest = test: fakeDrv "vm-test-${test.name}" { inherit test; };
    addDriverRunpath.driverLink = "/run/opengl-driver";
    rocmPackages = rocmPackages "7.2.2";
    formats.toml =
      { }:
      {
        # The value type of nixpkgs' pkgs.formats.toml.
        type =
          let
            valueType =
              types.nullOr (
                types.oneOf [
                  types.bool
                  types.int
                  types.float
                  types.str
                  types.path
                  (types.attrsOf valueType)
                  (types.listOf valueType)
                ]
              )
              // {
                description = "TOML value";
              };
          in
          types.attrsOf valueType;
        # Keeps the value instead of writing TOML.
        generate = name: value: fakeDrv name { inherit value; };
      };
  };

  nixos = {
    options = {
      assertions = option (types.listOf (
        types.submodule {
          options = {
            assertion = mkOption { type = types.bool; };
            message = mkOption { type = types.str; };
          };
        }
      )) [ ];
      warnings = option (types.listOf types.str) [ ];
      nix.package = option types.package (fakeDrv "nix" { });
      systemd.services = option (types.attrsOf (
        types.submodule {
          options = {
            description = mkOption { type = types.str; };
            wantedBy = option (types.listOf types.str) [ ];
            wants = option (types.listOf types.str) [ ];
            after = option (types.listOf types.str) [ ];
            environment = option (types.attrsOf types.str) { };
            path = option (types.listOf types.package) [ ];
            startLimitBurst = option (types.nullOr types.int) null;
            startLimitIntervalSec = option (types.nullOr types.int) null;
            serviceConfig = option (types.attrsOf (
              types.oneOf [
                types.bool
                types.int
                types.str
                (types.listOf types.str)
              ]
            )) { };
          };
        }
      )) { };
      networking.firewall.allowedTCPPorts = option (types.listOf types.port) [ ];
      environment.systemPackages = option (types.listOf types.package) [ ];

      # What nix/appliance.nix sets.
      fileSystems = option (types.attrsOf (types.attrsOf types.str)) { };
      boot.loader.grub.enable = option types.bool true;
      hardware.amdgpu.initrd.enable = option types.bool false;
      hardware.graphics.enable = option types.bool false;
      hardware.nvidia.open = option (types.nullOr types.bool) null;
      services.xserver.videoDrivers = option (types.listOf types.str) [ ];
      nixpkgs.config = option (types.attrsOf types.anything) { };
      nixpkgs.hostPlatform = option types.str "x86_64-linux";
      system.build.toplevel = option types.package (fakeDrv "nixos-system" { });

      # What tests/nix/vm-*.nix set.
      virtualisation.cores = option types.int 1;
      virtualisation.memorySize = option types.int 1024;
    };
  };
}
