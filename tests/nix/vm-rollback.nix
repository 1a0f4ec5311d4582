# VM test, one scenario: the health gate rolls a broken generation back by itself.
#
# The machine boots the cpu package on SmolLM2; the gate's first run makes the booted system
# generation 1 of /nix/var/nix/profiles/system (a test VM starts with no generation). Then a
# deliberately broken generation (a specialisation whose server refuses to start: context 1) is
# installed as generation 2 and activated, as `nixos-rebuild switch` would. The server never sends
# READY, the gate rolls back to generation 1 on its own, and the server answers again.
#
#   nix build .#checks.x86_64-linux.vm-rollback
#
# It needs KVM and downloads the model at build time; it has not been run where this repository's
# Nix checks run (no network, no KVM), only parsed there.
{
  luceboxModule,
  package,
  hosts,
}:
let
  smollm = hosts.models."smollm2-135m-instruct-q4_1";
in
{
  name = "lucebox-rollback";

  nodes.machine =
    { lib, pkgs, ... }:
    {
      imports = [ luceboxModule ];

      virtualisation = {
        cores = 2;
        memorySize = 3072;
      };

      services.lucebox = {
        enable = true;
        inherit package;
        pair = {
          target = { inherit (smollm) name url sha256; };
          drafter = "ngram";
        };
        healthGate.timeout = 120;
      };

      # `lucebox serve` refuses a context of one position, so this generation never gets READY.
      specialisation.broken.configuration = {
        services.lucebox.settings.context = lib.mkForce 1;
      };

      environment.systemPackages = [ pkgs.curl ];
    };

  testScript = ''
    import json

    def decisions():
        text = machine.succeed("cat /var/lib/lucebox-health-gate/decisions.jsonl")
        return [json.loads(line) for line in text.splitlines()]

    def completion():
        machine.succeed(
            "curl --fail --silent http://127.0.0.1:8080/v1/completions"
            " -H 'Content-Type: application/json'"
            " -d '{\"prompt\": \"Hello\", \"max_tokens\": 1}'"
        )

    machine.wait_for_unit("lucebox.service")
    completion()
    with subtest("the booted system passes and becomes generation 1"):
        machine.wait_until_succeeds("test -L /nix/var/nix/profiles/system-1-link", timeout=300)
        assert decisions()[0]["decision"] == "commit", decisions()
    good = machine.succeed("readlink -f /run/current-system").strip()

    with subtest("a broken generation is rolled back automatically"):
        broken = machine.succeed("readlink -f /run/current-system/specialisation/broken").strip()
        machine.succeed(f"nix-env --profile /nix/var/nix/profiles/system --set {broken}")
        # Its activation reports lucebox.service as failed; the gate then acts on its own.
        machine.execute(f"{broken}/bin/switch-to-configuration switch")
        machine.wait_until_succeeds(
            "grep -q '\"decision\":\"roll_back\"' /var/lib/lucebox-health-gate/decisions.jsonl",
            timeout=300,
        )
        machine.wait_until_succeeds(f"test \"$(readlink -f /run/current-system)\" = {good}", timeout=300)
        machine.succeed("test \"$(readlink /nix/var/nix/profiles/system)\" = system-1-link")
        rolled_back = [d for d in decisions() if d["decision"] == "roll_back"]
        assert rolled_back[0]["to"] == 1 and "never reached READY" in rolled_back[0]["reason"], rolled_back

    with subtest("the good generation serves again and passes"):
        machine.wait_for_unit("lucebox.service")
        completion()
        machine.wait_until_succeeds(
            "tail -n 1 /var/lib/lucebox-health-gate/decisions.jsonl | grep -q '\"decision\":\"commit\"'",
            timeout=300,
        )
  '';
}
