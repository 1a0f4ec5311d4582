# The NixOS configuration of a Lucebox appliance with this chip (its profile: hosts/rx7900.toml):
#   nixos-rebuild switch --flake .#rx7900
# The machine's disks and boot loader come from hosts/hardware-configuration.nix (nix/appliance.nix
# says how to make it); the GPU driver of the chip's vendor from nix/appliance.nix.
{
  imports = [
    ../modules/lucebox.nix
    ../nix/appliance.nix
  ];

  services.lucebox = {
    enable = true;
    chip = "rx7900";
  };
}
