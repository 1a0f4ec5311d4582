# services.lucebox: the Lucebox LLM server as a hardened systemd service that serves one chip's
# model-drafter pair from models fetched at build time, behind a health gate that rolls a bad
# generation back. Follows nixpkgs' nixos/modules/services/misc/ollama.nix.
#
# The chips, their pairs and the models come from hosts/*.toml through nix/hosts.nix; nothing about
# a chip is written here.
{
  config,
  lib,
  pkgs,
  ...
}:
let
  inherit (lib) literalExpression mkOption types;

  cfg = config.services.lucebox;

  hosts = import ../nix/hosts.nix { };
  chip = hosts.chips.${cfg.chip};
  modelFiles = import ../nix/models.nix { inherit (pkgs) fetchurl linkFarm; };
  settingsFormat = pkgs.formats.toml { };

  modelType = types.submodule {
    options = {
      name = mkOption {
        type = types.strMatching "[a-z0-9][a-z0-9._+-]*";
        example = "qwen2.5-coder-14b-instruct-q4_k_m";
        description = "The model's name; the file is served as `<name>.gguf`.";
      };
      url = mkOption {
        type = types.str;
        example = "https://huggingface.co/Qwen/Qwen2.5-Coder-14B-Instruct-GGUF/resolve/<revision>/qwen2.5-coder-14b-instruct-q4_k_m.gguf";
        description = "Where the GGUF file is fetched from, once, when the system is built.";
      };
      sha256 = mkOption {
        type = types.strMatching "[0-9a-f]{64}";
        description = "The sha256 of the whole file, as 64 hexadecimal digits.";
      };
    };
  };

  customPairType = types.submodule {
    options = {
      target = mkOption {
        type = modelType;
        description = "The target model.";
      };
      drafter = mkOption {
        type = types.either (types.enum [
          "ngram"
          "none"
        ]) modelType;
        default = "none";
        description = ''
          The drafter: a model, `"ngram"` for prompt lookup (no drafter model), or `"none"`.
        '';
      };
    };
  };

  # The pair served, in nix/hosts.nix's shape: a pair of the chip's profile, or the custom one.
  pair =
    if builtins.isString cfg.pair then
      chip.pairs.${cfg.pair}
    else
      let
        inherit (cfg.pair) target;
        drafter = if builtins.isString cfg.pair.drafter then null else cfg.pair.drafter;
      in
      {
        name = "custom";
        inherit target drafter;
        draft = if drafter == null then cfg.pair.drafter else drafter.name;
        models = [ target ] ++ lib.optional (drafter != null) drafter;
      };

  modelDir = modelFiles.pairDir pair;

  # A profile's pair is named; the server finds its models in LUCEBOX_MODEL_DIR by catalogue name.
  # A custom pair's models are not in the catalogue, so the server gets their files.
  pairSettings =
    if builtins.isString cfg.pair then
      { inherit (cfg) pair; }
    else
      {
        model = "${modelDir}/${pair.target.name}.gguf";
        draft = if pair.drafter == null then pair.draft else "${modelDir}/${pair.drafter.name}.gguf";
      };

  configFile = settingsFormat.generate "lucebox.toml" cfg.settings;

  # The device nodes each vendor's runtime opens (hosts/<chip>.toml [chip] vendor). The NVIDIA
  # classes are those of nixpkgs' ollama module; systemd matches `char-*` against /proc/devices.
  deviceAllow =
    {
      any = [ ];
      amd = [
        "char-drm rw" # /dev/dri/card*, /dev/dri/renderD*
        "/dev/kfd rw" # ROCm's compute queues
      ];
      nvidia = [
        "char-nvidiactl rw"
        "char-nvidia-caps rw"
        "char-nvidia-frontend rw"
        "char-nvidia-uvm rw"
      ];
    }
    .${chip.vendor};

  # Where the health gate reaches the server: a wildcard address is probed on loopback.
  probeHost =
    if cfg.host == "0.0.0.0" then
      "127.0.0.1"
    else if cfg.host == "::" then
      "[::1]"
    else if lib.hasInfix ":" cfg.host then
      "[${cfg.host}]"
    else
      cfg.host;
in
{
  options.services.lucebox = {
    enable = lib.mkEnableOption "Lucebox, the speculative-decoding LLM inference server";

    chip = mkOption {
      type = types.enum (builtins.attrNames hosts.chips);
      default = "cpu";
      example = "r9700";
      description = ''
        The chip the server runs on: the name of a host profile, `hosts/<chip>.toml`. It decides
        the package, the pairs that may be served, the engine's defaults and the device nodes the
        service may open.
      '';
    };

    package =
      lib.mkPackageOption pkgs [ "lucebox" cfg.chip ] {
        extraDescription = ''
          It must serve `services.lucebox.chip` (its `chip` attribute). The flake's overlay
          provides `pkgs.lucebox.<chip>` for every host profile, and its `nixosModules.default`
          sets this to the flake's `packages.<system>.<chip>`.
        '';
      }
      // {
        defaultText = literalExpression "pkgs.lucebox.\${config.services.lucebox.chip}";
      };

    pair = mkOption {
      type = types.either types.str customPairType;
      default = chip.defaultPair.name;
      defaultText = literalExpression ''the pair with `default = true` in hosts/''${config.services.lucebox.chip}.toml'';
      example = literalExpression ''
        {
          target = {
            name = "qwen2.5-coder-14b-instruct-q4_k_m";
            url = "https://huggingface.co/Qwen/Qwen2.5-Coder-14B-Instruct-GGUF/resolve/<revision>/qwen2.5-coder-14b-instruct-q4_k_m.gguf";
            sha256 = "<64 hexadecimal digits>";
          };
          drafter = "ngram";
        }
      '';
      description = ''
        The model-drafter pair to serve: the name of a pair of the chip's profile
        (`[[pairs]]` in `hosts/<chip>.toml`), or a custom pair of models given by URL and sha256.
        Either way the models are fetched when the system is built, never by the running server.
      '';
    };

    host = mkOption {
      type = types.str;
      default = "127.0.0.1";
      example = "0.0.0.0";
      description = "The IP address the server listens on (an address, not a host name).";
    };

    port = mkOption {
      type = types.port;
      default = 8080;
      example = 11434;
      description = "The port the server listens on.";
    };

    openFirewall = mkOption {
      type = types.bool;
      default = false;
      description = ''
        Whether to open the firewall for the server: adds `services.lucebox.port` to
        `networking.firewall.allowedTCPPorts`.
      '';
    };

    apiKeyFile = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = "/run/secrets/lucebox-api-key";
      description = ''
        A file holding the API key that every route but `/health` requires
        (`Authorization: Bearer <key>`), or `null` for no key. Give it as a string path outside
        the Nix store: systemd hands it to the service as a credential (`LoadCredential=`), and a
        Nix path would copy the key into the world-readable store.
      '';
    };

    settings = mkOption {
      type = types.submodule { freeformType = settingsFormat.type; };
      default = { };
      example = {
        context = 8192;
        max_sequences = 8;
        log_format = "json";
      };
      description = ''
        The server's configuration, rendered with `pkgs.formats.toml` to the file that
        `lucebox serve --config` reads. Keys are those of `lucebox serve --help` with
        underscores: `model`, `draft`, `draft_tokens`, `context`, `max_sequences`, `step_tokens`,
        `kv_cache_mib`, `threads`, `host`, `port`, `max_tokens`, `queue`, `max_body_bytes`,
        `log_format`, `chip`, `pair`, `api_key_file`. The chip's profile supplies the engine's
        defaults; `chip`, `pair` (or `model` and `draft` for a custom pair), `host` and `port`
        are set from the options of the same names: set those options, not these keys.
      '';
    };

    environment = mkOption {
      type = types.attrsOf types.str;
      default = { };
      example = {
        RUST_LOG = "lucebox=debug,info";
      };
      description = ''
        Extra environment variables of the server. `LUCEBOX_MODEL_DIR` is the pair's model
        directory and is set by the module.
      '';
    };

    healthGate = {
      enable = mkOption {
        type = types.bool;
        default = true;
        description = ''
          Whether to check the server after every activation (`nixos-rebuild switch` or `test`)
          and every boot, with `lucebox health-gate`: it waits for lucebox.service to be active
          (READY=1), then asks `/health` and for a one-token completion. On success it makes the
          running generation the boot default; on failure it switches back to the last
          generation that passed (rebooting into it when the failure came with a fresh boot),
          and records why in {file}`/var/lib/lucebox-health-gate/decisions.jsonl`.
        '';
      };

      timeout = mkOption {
        type = types.ints.positive;
        default = 900;
        example = 1800;
        description = ''
          How long, in seconds, the server may take to pass the gate (`--timeout-secs`): to be
          active, then to answer both probes. The gate is ordered after lucebox.service, so it
          starts once the server's start has finished or failed.
        '';
      };

      maxBootFailures = mkOption {
        type = types.ints.positive;
        default = 1;
        example = 3;
        description = ''
          How many fresh boots in a row the running generation may fail the gate before the
          gate rolls back (`--max-boot-failures`); before that, a failed boot reboots to try
          again.
        '';
      };
    };
  };

  config = lib.mkIf cfg.enable {
    assertions = [
      {
        assertion = (cfg.package.chip or cfg.chip) == cfg.chip;
        message = ''
          services.lucebox.package serves chip "${cfg.package.chip or ""}" but services.lucebox.chip is "${cfg.chip}".
          Set services.lucebox.package = pkgs.lucebox.${cfg.chip} (the flake's packages.<system>.${cfg.chip}),
          or services.lucebox.chip = "${cfg.package.chip or ""}".
        '';
      }
      {
        assertion = !(builtins.isString cfg.pair) || chip.pairs ? ${cfg.pair};
        message = ''
          services.lucebox.pair = "${toString cfg.pair}" is not a pair of chip ${cfg.chip}; hosts/${cfg.chip}.toml has ${
            lib.concatMapStringsSep ", " (name: ''"${name}"'') (builtins.attrNames chip.pairs)
          }.
          Pick one of those, or give a custom pair: { target = { name = ...; url = ...; sha256 = ...; }; drafter = "ngram"; }.
        '';
      }
      {
        assertion = cfg.apiKeyFile == null || lib.hasPrefix "/" cfg.apiKeyFile;
        message = ''
          services.lucebox.apiKeyFile = "${toString cfg.apiKeyFile}" is not an absolute path: give the file's full path, such as "/run/secrets/lucebox-api-key".
        '';
      }
      {
        assertion = cfg.apiKeyFile == null || !(lib.hasPrefix "${builtins.storeDir}/" cfg.apiKeyFile);
        message = ''
          services.lucebox.apiKeyFile = "${toString cfg.apiKeyFile}" is in the Nix store, which every user can read.
          Keep the key in a file outside ${builtins.storeDir} (for example one that sops-nix or agenix puts under /run/secrets) and give that path.
        '';
      }
    ];

    warnings = lib.optional chip.standIn ''
      services.lucebox: chip ${cfg.chip} runs the CPU engine as a stand-in (hosts/${cfg.chip}.toml: [engine] backend = "cpu"); its GPU kernels are not written yet.
    '';

    services.lucebox.settings = {
      inherit (cfg) chip host port;
    }
    // pairSettings;

    systemd.services.lucebox = {
      description = "Lucebox LLM inference server (${cfg.chip})";
      wantedBy = [ "multi-user.target" ];
      after = [ "network.target" ];
      environment = cfg.environment // {
        LUCEBOX_MODEL_DIR = "${modelDir}";
      };
      # A server that keeps failing stops being restarted, and the health gate then rolls back.
      startLimitBurst = 3;
      startLimitIntervalSec = 3600;
      serviceConfig = {
        # READY=1 once the model is loaded and a self-test passed, WATCHDOG=1 from the engine's
        # loop, STOPPING=1 while it drains (crates/server/src/notify.rs).
        Type = "notify";
        # The key reaches the server as a credential. systemd expands %d (the credentials
        # directory, $CREDENTIALS_DIRECTORY) in ExecStart=, but not inside the TOML file the
        # server reads, and the server does not expand variables there: so the path is a flag.
        ExecStart =
          "${lib.getExe cfg.package} serve --config ${configFile}"
          + lib.optionalString (cfg.apiKeyFile != null) " --api-key-file %d/api-key";
        LoadCredential = lib.optional (cfg.apiKeyFile != null) "api-key:${cfg.apiKeyFile}";
        # Loading a 35 GB model (and its self-test) takes a while; the watchdog starts only
        # once READY=1 has arrived.
        TimeoutStartSec = "30min";
        WatchdogSec = "60s";
        Restart = "on-failure";
        RestartSec = "5s";

        DynamicUser = true;
        StateDirectory = "lucebox";
        CacheDirectory = "lucebox";
        WorkingDirectory = "%S/lucebox";

        DeviceAllow = deviceAllow;
        DevicePolicy = "closed";
        PrivateDevices = chip.vendor == "any"; # a GPU chip needs its device nodes
        SupplementaryGroups = lib.optional (chip.vendor == "amd") "render"; # /dev/dri/renderD*, /dev/kfd

        # The hardening of nixpkgs' ollama module.
        CapabilityBoundingSet = [ "" ];
        LockPersonality = true;
        MemoryDenyWriteExecute = true;
        NoNewPrivileges = true;
        PrivateTmp = true;
        PrivateUsers = true;
        ProcSubset = "all"; # /proc/cpuinfo, /proc/meminfo
        ProtectClock = true;
        ProtectControlGroups = true;
        ProtectHome = true;
        ProtectHostname = true;
        ProtectKernelLogs = true;
        ProtectKernelModules = true;
        ProtectKernelTunables = true;
        ProtectProc = "invisible";
        ProtectSystem = "strict";
        RemoveIPC = true;
        RestrictNamespaces = true;
        RestrictRealtime = true;
        RestrictSUIDSGID = true;
        RestrictAddressFamilies = [
          "AF_INET"
          "AF_INET6"
          "AF_UNIX"
        ];
        SystemCallArchitectures = "native";
        SystemCallFilter = [
          "@system-service @resources"
          "~@privileged"
        ];
        UMask = "0077";
      };
    };

    # The health gate: a oneshot, run as root, after lucebox.service on every boot and every
    # activation. The decision and the rollback are lucebox's (`lucebox health-gate`).
    #
    # Why it runs again on every `nixos-rebuild switch` and `test`: switch-to-configuration starts
    # every active target that does not refuse manual start (nixpkgs
    # pkgs/by-name/sw/switch-to-configuration-ng/src/src/main.rs: "Cause all active target units
    # to be restarted below"), and starting multi-user.target again starts each unit it wants that
    # is inactive. A `Type=oneshot` unit without `RemainAfterExit=` is inactive once it has run,
    # so it runs on every activation, whether or not anything changed. restartTriggers would not
    # do: switch-to-configuration compares and restarts only units that are active, and would
    # re-run the gate only when its own unit file changed.
    #
    # It must not deadlock the switch that started it: switch-to-configuration waits for this
    # unit's start job and holds /run/nixos/switch-to-configuration.lock meanwhile (a second
    # switch-to-configuration exits at once on that lock). So the gate never switches
    # generations itself: it launches its commands through `systemd-run --no-block`, in a
    # transient unit (lucebox-health-gate-action) that outlives the gate and the running switch.
    systemd.services.lucebox-health-gate = lib.mkIf cfg.healthGate.enable {
      description = "Lucebox health gate: keep this generation only if the server answers";
      wantedBy = [ "multi-user.target" ];
      wants = [ "lucebox.service" ];
      after = [ "lucebox.service" ];
      # nix-env for the system profile, flock to wait for a running switch-to-configuration;
      # systemctl and systemd-run are on every unit's PATH. The commands the gate launches run
      # with this PATH too.
      path = [
        config.nix.package
        pkgs.util-linux
      ];
      serviceConfig = {
        Type = "oneshot";
        ExecStart = lib.escapeShellArgs (
          [
            (lib.getExe cfg.package)
            "health-gate"
            "--unit"
            "lucebox.service"
            "--url"
            "http://${probeHost}:${toString cfg.port}"
            "--state-dir"
            "/var/lib/lucebox-health-gate"
            "--system-profile"
            "/nix/var/nix/profiles/system"
            "--timeout-secs"
            (toString cfg.healthGate.timeout)
            "--max-boot-failures"
            (toString cfg.healthGate.maxBootFailures)
          ]
          ++ lib.optionals (cfg.apiKeyFile != null) [
            "--api-key-file"
            cfg.apiKeyFile
          ]
        );
        StateDirectory = "lucebox-health-gate";
        TimeoutStartSec = cfg.healthGate.timeout + 60;
      };
    };

    networking.firewall = lib.mkIf cfg.openFirewall { allowedTCPPorts = [ cfg.port ]; };

    environment.systemPackages = [ cfg.package ];
  };
}
