// gpubox sandbox STAND-IN for gpu-burn's compare.cu. It is never shipped to a real box and
// holds no kernel: the stand-in Makefile only needs a source for its %.fatbin rule, and the
// stand-in nvcc-fatbin writes a compare.fatbin that names the images a real build would hold.
