# Evaluates modules/lucebox.nix with a real lib.evalModules (nixpkgs.lib) and checks the units it
# produces. Run by tests/nix/check:
#
#   nix-instantiate --readonly-mode --eval --strict tests/nix/eval-module.nix --arg lib 'import <nixpkgs.lib>/lib'
#
# This is not NixOS: nixpkgs itself cannot be had where this runs, so the NixOS options the module
# sets and `pkgs` are stand-ins (tests/nix/stand-in.nix: typed option declarations, fake store
# paths, a pkgs.formats.toml that keeps the value instead of writing TOML). What is checked is the
# module's output (serviceConfig, environment, assertions), not the unit file systemd reads; the
# VM test (tests/nix/vm-serve.nix) runs the real thing.
{ lib }:
let
  standIn = import ./stand-in.nix { inherit lib; };
  inherit (standIn) pkgs store expect;

  hosts = import ../../nix/hosts.nix { };

  eval =
    settings:
    (lib.evalModules {
      modules = [
        standIn.nixos
        ../../modules/lucebox.nix
        { _module.args.pkgs = pkgs; }
        { services.lucebox = settings; }
      ];
    }).config;

  failedAssertions = config: map (a: a.message) (lib.filter (a: !a.assertion) config.assertions);

  # A check that one failed assertion's message contains `text`.
  expectAssertion =
    name: config: text:
    let
      messages = failedAssertions config;
    in
    if lib.any (lib.hasInfix text) messages then
      name
    else
      throw "FAIL ${name}: no failed assertion says ${builtins.toJSON text}; failed: ${builtins.toJSON messages}";

  unit = config: config.systemd.services.lucebox.serviceConfig;
  gate = config: config.systemd.services.lucebox-health-gate;
  bin = chip: "${store}-lucebox-${chip}/bin/lucebox";

  cpu = eval { enable = true; };
  r9700 = eval {
    enable = true;
    chip = "r9700";
  };
  rtx3090 = eval {
    enable = true;
    chip = "rtx3090";
  };
  withKey = eval {
    enable = true;
    apiKeyFile = "/run/secrets/lucebox-api-key";
    host = "0.0.0.0";
    port = 9000;
    openFirewall = true;
  };
  custom = eval {
    enable = true;
    pair = {
      target = {
        name = "my-model-q4_k_m";
        url = "https://example.org/my-model.gguf";
        sha256 = "0000000000000000000000000000000000000000000000000000000000000000";
      };
      drafter = "ngram";
    };
  };

  modelFiles = import ../../nix/models.nix { inherit (pkgs) fetchurl linkFarm; };
  cpuDefault = hosts.chips.cpu.defaultPair;
  cpuModelDir = modelFiles.pairDir cpuDefault;
in
[
  # The cpu chip, every option at its default.
  (expect "cpu: Type=notify" (unit cpu).Type "notify")
  (expect "cpu: ExecStart" (unit cpu).ExecStart "${bin "cpu"} serve --config ${store}-lucebox.toml")
  (expect "cpu: rendered settings" cpu.services.lucebox.settings {
    chip = "cpu";
    host = "127.0.0.1";
    port = 8080;
    pair = cpuDefault.name;
  })
  (expect "cpu: no device nodes" ((unit cpu).DeviceAllow) [ ])
  (expect "cpu: DevicePolicy=closed" (unit cpu).DevicePolicy "closed")
  (expect "cpu: PrivateDevices" (unit cpu).PrivateDevices true)
  (expect "cpu: watchdog and start timeout" [
    (unit cpu).WatchdogSec
    (unit cpu).TimeoutStartSec
    (unit cpu).Restart
  ] [ "60s" "30min" "on-failure" ])
  (expect "cpu: the hardening of nixpkgs' ollama module" (lib.getAttrs [
    "CapabilityBoundingSet"
    "LockPersonality"
    "MemoryDenyWriteExecute"
    "NoNewPrivileges"
    "PrivateTmp"
    "PrivateUsers"
    "ProtectHome"
    "ProtectKernelModules"
    "ProtectKernelTunables"
    "ProtectSystem"
    "RestrictNamespaces"
    "RestrictSUIDSGID"
    "SystemCallArchitectures"
    "SystemCallFilter"
  ] (unit cpu)) {
    CapabilityBoundingSet = [ "" ];
    LockPersonality = true;
    MemoryDenyWriteExecute = true;
    NoNewPrivileges = true;
    PrivateTmp = true;
    PrivateUsers = true;
    ProtectHome = true;
    ProtectKernelModules = true;
    ProtectKernelTunables = true;
    ProtectSystem = "strict";
    RestrictNamespaces = true;
    RestrictSUIDSGID = true;
    SystemCallArchitectures = "native";
    SystemCallFilter = [
      "@system-service @resources"
      "~@privileged"
    ];
  })
  (expect "cpu: start limit" [
    cpu.systemd.services.lucebox.startLimitBurst
    cpu.systemd.services.lucebox.startLimitIntervalSec
  ] [ 3 3600 ])
  (expect "cpu: DynamicUser, state and cache" [
    (unit cpu).DynamicUser
    (unit cpu).StateDirectory
    (unit cpu).CacheDirectory
  ] [ true "lucebox" "lucebox" ])
  (expect "cpu: no credential without a key" (unit cpu).LoadCredential [ ])
  (expect "cpu: model directory" cpu.systemd.services.lucebox.environment.LUCEBOX_MODEL_DIR
    "${store}-lucebox-models-${cpuDefault.name}"
  )
  (expect "cpu: model directory holds the default pair's files by catalogue name"
    (map (entry: entry.name) cpuModelDir.entries)
    (map (model: "${model.name}.gguf") cpuDefault.models)
  )
  (expect "cpu: models fetched from the catalogue's URL with its sha256" (map (entry: {
    inherit (entry.path) url sha256;
  }) cpuModelDir.entries) (map (model: { inherit (model) url sha256; }) cpuDefault.models))
  (expect "cpu: no assertion fails" (failedAssertions cpu) [ ])
  (expect "cpu: no stand-in warning" cpu.warnings [ ])
  (expect "cpu: health gate is a oneshot after lucebox.service, wanted by multi-user.target" {
    inherit ((gate cpu).serviceConfig) Type;
    inherit (gate cpu) wantedBy wants after;
    remainAfterExit = (gate cpu).serviceConfig ? RemainAfterExit;
  } {
    Type = "oneshot";
    wantedBy = [ "multi-user.target" ];
    wants = [ "lucebox.service" ];
    after = [ "lucebox.service" ];
    remainAfterExit = false;
  })
  (expect "cpu: health gate ExecStart" (gate cpu).serviceConfig.ExecStart (
    "${bin "cpu"} health-gate --unit lucebox.service --url http://127.0.0.1:8080"
    + " --state-dir /var/lib/lucebox-health-gate --system-profile /nix/var/nix/profiles/system"
    + " --timeout-secs 900 --max-boot-failures 1"
  ))
  (expect "cpu: health gate has nix-env and flock" (map (p: p.name) (gate cpu).path) [ "nix" "util-linux" ])
  (expect "cpu: health gate timeout covers its probes" (gate cpu).serviceConfig.TimeoutStartSec 960)
  (expect "cpu: health gate can be turned off"
    (
      (eval {
        enable = true;
        healthGate.enable = false;
      }).systemd.services ? lucebox-health-gate
    )
    false
  )
  (expect "disabled: no units" (eval { }).systemd.services { })

  # An AMD chip.
  (expect "r9700: package from pkgs.lucebox.r9700" (unit r9700).ExecStart
    "${bin "r9700"} serve --config ${store}-lucebox.toml"
  )
  (expect "r9700: DRM and KFD device nodes" (unit r9700).DeviceAllow [
    "char-drm rw"
    "/dev/kfd rw"
  ])
  (expect "r9700: render group" (unit r9700).SupplementaryGroups [ "render" ])
  (expect "r9700: devices visible" (unit r9700).PrivateDevices false)
  (expect "r9700: default pair" r9700.services.lucebox.settings.pair hosts.chips.r9700.defaultPair.name)
  (expect "r9700 and rtx3090: their own engines, no stand-in warning" (map (
    config: lib.any (lib.hasInfix "stand-in") config.warnings
  ) [ r9700 rtx3090 ]) [ false false ])

  # An NVIDIA chip.
  (expect "rtx3090: NVIDIA device nodes" (unit rtx3090).DeviceAllow [
    "char-nvidiactl rw"
    "char-nvidia-caps rw"
    "char-nvidia-frontend rw"
    "char-nvidia-uvm rw"
  ])
  (expect "rtx3090: no extra groups" (unit rtx3090).SupplementaryGroups [ ])

  # The API key, a wildcard address, the firewall.
  (expect "key: credential" (unit withKey).LoadCredential [ "api-key:/run/secrets/lucebox-api-key" ])
  (expect "key: the server reads it from the credentials directory" (unit withKey).ExecStart
    "${bin "cpu"} serve --config ${store}-lucebox.toml --api-key-file %d/api-key"
  )
  (expect "key: the gate reads the file, probes loopback"
    (lib.hasInfix " --url http://127.0.0.1:9000 " (gate withKey).serviceConfig.ExecStart
      && lib.hasSuffix " --api-key-file /run/secrets/lucebox-api-key" (gate withKey).serviceConfig.ExecStart
    )
    true
  )
  (expect "key: firewall" withKey.networking.firewall.allowedTCPPorts [ 9000 ])
  (expect "key: no assertion fails" (failedAssertions withKey) [ ])

  # A custom pair: the server gets the files.
  (expect "custom: model and draft" custom.services.lucebox.settings {
    chip = "cpu";
    host = "127.0.0.1";
    port = 8080;
    model = "${store}-lucebox-models-custom/my-model-q4_k_m.gguf";
    draft = "ngram";
  })

  # Assertions, with the messages the user reads.
  (expectAssertion "assertion: a pair of another chip"
    (eval {
      enable = true;
      chip = "r9700";
      pair = "qwen2.5-coder-1.5b+0.5b";
    })
    ''services.lucebox.pair = "qwen2.5-coder-1.5b+0.5b" is not a pair of chip r9700; hosts/r9700.toml has "qwen2.5-coder-32b+0.5b", "qwen3-32b+0.6b".''
  )
  (expectAssertion "assertion: the package serves another chip"
    (eval {
      enable = true;
      chip = "r9700";
      package = pkgs.lucebox.cpu;
    })
    ''services.lucebox.package serves chip "cpu" but services.lucebox.chip is "r9700".''
  )
  (expectAssertion "assertion: key in the store"
    (eval {
      enable = true;
      apiKeyFile = "/nix/store/00000000000000000000000000000000-key";
    })
    "is in the Nix store, which every user can read"
  )
  (expectAssertion "assertion: relative key path"
    (eval {
      enable = true;
      apiKeyFile = "secrets/key";
    })
    "is not an absolute path"
  )
  (expect "settings may not contradict the options"
    (builtins.tryEval
      (eval {
        enable = true;
        settings.port = 1;
      }).services.lucebox.settings.port
    ).success
    false
  )
]
