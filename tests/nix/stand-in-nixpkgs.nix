# What `import nixpkgs { system; config; }` gives flake.nix in tests/nix/eval-flake.nix (the
# stand-in nixpkgs input's outPath): the CUDA package set flake.nix takes from that import, which
# keeps the config it was imported with so that the test can check what it allows.
{
  system,
  config ? { },
}:
let
  inherit (import ./fake-drv.nix) fakeDrv;
in
{
  cudaPackages_12 = {
    cudaMajorMinorVersion = "12.9";
    cuda_nvcc = fakeDrv "cuda_nvcc-12.9" { };
    cuda_cudart = fakeDrv "cuda_cudart-12.9" { };
    backendStdenv.cc = fakeDrv "gcc-wrapper-14" { };
    importedWith = { inherit system config; };
  };
}
