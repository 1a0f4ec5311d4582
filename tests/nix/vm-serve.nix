# VM test, one scenario: the cpu package as a NixOS service. It boots, waits for lucebox.service
# to be active (Type=notify: only after READY=1, so the model is loaded and the self-test passed),
# then asks /health and for a one-token completion.
#
#   nix build .#checks.x86_64-linux.vm-serve
#
# It needs KVM and downloads the model at build time; it has not been run where this repository's
# Nix checks run (no network, no KVM), only parsed there.
{
  luceboxModule,
  package,
  hosts,
}:
let
  # The smallest model of the catalogue, with prompt lookup for drafts: the test is about the
  # service, not the default pair (1.6 GB).
  smollm = hosts.models."smollm2-135m-instruct-q4_1";
in
{
  name = "lucebox-serve";

  nodes.machine =
    { pkgs, ... }:
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
        # The gate's rollback works on generations of /nix/var/nix/profiles/system, which a test
        # VM does not have.
        healthGate.enable = false;
      };

      environment.systemPackages = [ pkgs.curl ];
    };

  testScript = ''
    machine.wait_for_unit("lucebox.service")
    machine.succeed("curl --fail --silent http://127.0.0.1:8080/health")
    out = machine.succeed(
        "curl --fail --silent http://127.0.0.1:8080/v1/completions"
        " -H 'Content-Type: application/json'"
        " -d '{\"prompt\": \"Hello\", \"max_tokens\": 1}'"
    )
    assert '"choices"' in out, out
  '';
}
