# Fake derivations for the stand-ins (tests/nix/stand-in.nix, stand-in-nixpkgs.nix): attribute
# sets with fake store paths that keep their arguments, so a test can look at what would be
# built. Needs no nixpkgs lib.
rec {
  store = "/nix/store/00000000000000000000000000000000";

  fakeDrv =
    name: attrs:
    {
      type = "derivation";
      inherit name;
      outPath = "${store}-${name}";
      drvPath = "${store}-${name}.drv";
    }
    // attrs;
}
