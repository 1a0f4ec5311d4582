# The host profiles (hosts/<chip>.toml) and the model catalogue (hosts/models.toml), read with
# builtins only (no nixpkgs), so that the flake, the NixOS module and tests/nix/check read the TOML
# files one way and no chip name, architecture, hash, size or URL is written anywhere else. The Rust
# side (lucebox-appliance) embeds the same files.
#
#   models.<name>     a catalogue entry as hosts/models.toml has it, plus `url`: its first
#                     `kind = "url"` source, the one the flake fetches
#   chips.<chip>      one profile:
#     name, file        the chip's name (the file's stem) and its hosts/<chip>.toml
#     profile           the parsed file: [chip], [engine], [[pairs]]
#     vendor            "any" (CPU), "amd" or "nvidia"
#     standIn           true when the package runs the CPU engine on a GPU chip
#                       ([engine] backend = "cpu" while the vendor is not "any")
#     description       the package's meta.description, saying so when it is a stand-in
#     pairs.<pair>      { name, default, verified, target, drafter, draft, models }
#                         target, drafter  catalogue entries; drafter is null for "ngram"
#                                          (prompt lookup: no drafter model)
#                         draft            what `lucebox serve --draft` takes: the drafter's
#                                          catalogue name, or "ngram"
#                         models           the entries the pair needs: the target, then the drafter
#     defaultPair       the pair marked `default = true` (exactly one)
{
  dir ? ../hosts,
}:
let
  inherit (builtins)
    attrNames
    filter
    fromTOML
    head
    length
    listToAttrs
    match
    readDir
    readFile
    ;

  catalogue = fromTOML (readFile (dir + "/models.toml"));

  firstUrl =
    model:
    let
      urls = filter (source: source.kind == "url") model.sources;
    in
    if urls == [ ] then
      throw "hosts/models.toml: ${model.name} has no `kind = \"url\"` source, and the flake fetches only URLs"
    else
      (head urls).url;

  models = listToAttrs (
    map (model: {
      inherit (model) name;
      value = model // {
        url = firstUrl model;
      };
    }) catalogue.models
  );

  entries = readDir dir;

  chipNames = map (file: head (match "(.*)\\.toml" file)) (
    filter (
      file: file != "models.toml" && match ".*\\.toml" file != null && entries.${file} == "regular"
    ) (attrNames entries)
  );

  runtimeNames = {
    cuda = "CUDA";
    rocm = "ROCm";
  };

  readChip =
    chipName:
    let
      file = dir + "/${chipName}.toml";
      profile = fromTOML (readFile file);
      inherit (profile) chip engine;

      model =
        modelName:
        models.${modelName}
          or (throw "hosts/${chipName}.toml: ${modelName} is not a model of hosts/models.toml");

      readPair =
        raw:
        let
          target = model raw.target;
          drafter = if raw.drafter == "ngram" then null else model raw.drafter;
        in
        {
          inherit (raw) name verified;
          default = raw.default or false;
          inherit target drafter;
          draft = if drafter == null then "ngram" else drafter.name;
          models = [ target ] ++ (if drafter == null then [ ] else [ drafter ]);
        };

      pairs = listToAttrs (
        map (raw: {
          inherit (raw) name;
          value = readPair raw;
        }) profile.pairs
      );

      defaults = filter (pair: pair.default) (map readPair profile.pairs);

      standIn = engine.backend == "cpu" && chip.vendor != "any";
    in
    if chip.name != chipName then
      throw "hosts/${chipName}.toml: [chip] name is \"${chip.name}\"; it must be the file's stem, \"${chipName}\""
    else
      {
        name = chipName;
        inherit file profile pairs standIn;
        inherit (chip) vendor;
        defaultPair =
          if length defaults == 1 then
            head defaults
          else
            throw "hosts/${chipName}.toml: ${toString (length defaults)} pairs have `default = true`; exactly one must";
        description =
          "Lucebox speculative-decoding LLM server: ${chip.description}"
          + (
            if standIn then
              ". Runs the CPU engine as a stand-in: the ${runtimeNames.${chip.runtime}} ${chip.runtime_version}"
              + " kernels for ${chip.kernel_target} are not written yet"
            else
              ""
          );
      };
in
{
  inherit models;
  chips = listToAttrs (
    map (chipName: {
      name = chipName;
      value = readChip chipName;
    }) chipNames
  );
}
