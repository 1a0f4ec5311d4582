# What the flake and the module rely on from nix/hosts.nix, per chip, with builtins only (no
# nixpkgs). Run by tests/nix/check:
#
#   nix-instantiate --readonly-mode --eval --strict tests/nix/hosts-test.nix
#
# Evaluates to the list of the checks that passed; the first that fails stops it with its reason.
let
  inherit (builtins)
    all
    attrNames
    concatMap
    filter
    hasAttr
    isInt
    length
    match
    pathExists
    readFile
    ;

  hosts = import ../../nix/hosts.nix { };

  check = name: ok: if ok then name else throw "FAIL ${name}";

  # Whether `part` occurs in `text`.
  contains =
    text: part:
    let
      n = builtins.stringLength part;
      from = i: i + n <= builtins.stringLength text && (builtins.substring i n text == part || from (i + 1));
    in
    from 0;

  isModel =
    model:
    match "[0-9a-f]{64}" model.sha256 != null
    && match "https://.+" model.url != null
    && isInt model.bytes
    && model.bytes > 0;

  chipChecks =
    chipName:
    let
      chip = hosts.chips.${chipName};
      inherit (chip.profile) engine;
      info = chip.profile.chip;
      pairs = map (name: chip.pairs.${name}) (attrNames chip.pairs);
      gpu = chip.vendor != "any";
      hostFile = ../../hosts + "/${chipName}.nix";
    in
    map (c: check "${chipName}: ${c.name}" c.ok) [
      {
        name = "[chip] name is the file's stem";
        ok = info.name == chipName;
      }
      {
        name = "vendor is any, amd or nvidia";
        ok = builtins.elem chip.vendor [
          "any"
          "amd"
          "nvidia"
        ];
      }
      {
        name = "runtime matches the vendor";
        ok =
          info.runtime == {
            any = "none";
            amd = "rocm";
            nvidia = "cuda";
          }.${chip.vendor};
      }
      {
        name = "a GPU chip names its runtime version and kernel target";
        ok = !gpu || (hasAttr "runtime_version" info && hasAttr "kernel_target" info);
      }
      {
        name = "exactly one default pair";
        ok = length (filter (pair: pair.default) pairs) == 1 && chip.defaultPair.default;
      }
      {
        name = "every pair resolves to catalogue entries with url and sha256";
        ok = all (pair: all isModel pair.models) pairs;
      }
      {
        name = "ngram pairs have no drafter model, the others a catalogue drafter";
        ok = all (
          pair:
          if pair.draft == "ngram" then
            pair.drafter == null && length pair.models == 1
          else
            pair.drafter.name == pair.draft && length pair.models == 2
        ) pairs;
      }
      {
        name = "a stand-in is a GPU chip on the CPU engine";
        ok = chip.standIn == (gpu && engine.backend == "cpu");
      }
      {
        name = "the description says so when the CPU engine stands in";
        ok = contains chip.description "Runs the CPU engine as a stand-in" == chip.standIn;
      }
      {
        name = "the description carries the profile's";
        ok = contains chip.description info.description;
      }
      {
        name = "hosts/${chipName}.nix exists and sets this chip";
        ok = pathExists hostFile && contains (readFile hostFile) "chip = \"${chipName}\";";
      }
    ];
in
[
  (check "the catalogue: every model has a URL and a sha256" (
    all (name: isModel hosts.models.${name}) (attrNames hosts.models)
  ))
  (check "the cpu profile, the default of the flake and the module, exists" (hasAttr "cpu" hosts.chips))
]
++ concatMap chipChecks (attrNames hosts.chips)
