# What every hosts/<chip>.nix shares: the GPU driver of the chip's vendor ([chip] vendor of
# hosts/<chip>.toml) and the machine's own hardware-configuration.nix.
#
# Disks, file systems and the boot loader belong to the machine, not to this repository: put the
# output of `nixos-generate-config --show-hardware-config` in hosts/hardware-configuration.nix and
# `git add` it (a flake sees only files git knows). Until then a clearly marked placeholder lets
# the configuration evaluate (`nix flake check`), and a warning says it will not boot.
{
  config,
  lib,
  ...
}:
let
  hosts = import ./hosts.nix { };
  inherit (hosts.chips.${config.services.lucebox.chip}) vendor;

  hardwareConfiguration = ../hosts/hardware-configuration.nix;
  haveHardwareConfiguration = builtins.pathExists hardwareConfiguration;
in
{
  imports = lib.optional haveHardwareConfiguration hardwareConfiguration;

  config = lib.mkMerge [
    (lib.mkIf (!haveHardwareConfiguration) {
      # PLACEHOLDER, not a machine: only so that the configuration evaluates. No boot loader is
      # installed, so switching to it leaves the machine's boot entries as they were.
      fileSystems."/" = {
        device = "/dev/disk/by-label/nixos";
        fsType = "ext4";
      };
      boot.loader.grub.enable = false;
      warnings = [
        ''
          hosts/hardware-configuration.nix is missing: this configuration has placeholder file systems and no boot loader, and will not boot.
          On the machine run `nixos-generate-config --show-hardware-config > hosts/hardware-configuration.nix`, add your boot loader settings, `git add` it, and rebuild.
        ''
      ];
    })

    (lib.mkIf (vendor == "amd") {
      # amdgpu, loaded from the initrd: /dev/dri/renderD* and /dev/kfd, which ROCm opens.
      hardware.amdgpu.initrd.enable = true;
      hardware.graphics.enable = true;
    })

    (lib.mkIf (vendor == "nvidia") {
      # NixOS picks the NVIDIA kernel driver through videoDrivers, also on a machine without X.
      services.xserver.videoDrivers = [ "nvidia" ];
      # The open kernel modules: the only ones for Blackwell (RTX 5090), supported on Ampere
      # (RTX 3090).
      hardware.nvidia.open = true;
      hardware.graphics.enable = true;
      # The driver's user space is unfree.
      nixpkgs.config.allowUnfreePredicate =
        pkg:
        builtins.elem (lib.getName pkg) [
          "nvidia-x11"
          "nvidia-settings"
        ];
    })
  ];
}
