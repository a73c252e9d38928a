// Package gpu is the vocabulary of GPU memory shared by every part of vramscope:
// devices, allocator events, segments and blocks, stacks, and the layout of the
// address space at one instant. It imports nothing of ours and does no I/O.
package gpu
