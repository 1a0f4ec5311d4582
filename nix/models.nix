# Model files as fixed-output derivations, and the directory a pair's models are served from.
# Shared by the flake (packages, apps) and the NixOS module, so both fetch the same way.
#
# A model is `{ name, url, sha256, ... }`: a catalogue entry of nix/hosts.nix, or a custom one given
# to services.lucebox.pair. A pair is `{ name, models, ... }` (nix/hosts.nix's pair shape).
{ fetchurl, linkFarm }:
rec {
  # The file, fetched once at build time and checked against its sha256; `<name>.gguf`.
  model =
    entry:
    fetchurl {
      name = "${entry.name}.gguf";
      inherit (entry) url sha256;
    };

  # The directory that LUCEBOX_MODEL_DIR names: `<name>.gguf` for each model of the pair. The
  # server takes `$LUCEBOX_MODEL_DIR/<catalogue name>.gguf` when it is there with the catalogue's
  # size, so it never fetches at run time.
  pairDir =
    pair:
    linkFarm "lucebox-models-${pair.name}" (
      map (entry: {
        name = "${entry.name}.gguf";
        path = model entry;
      }) pair.models
    );
}
