// Package scripts holds no Go code: its tests check the scripts beside
// them (gpu-check.sh and the GPU checks it runs) on a machine without a
// GPU: the preparation, the refusal, the order of checks with their
// limits, and each check's table and verdict on real recordings.
package scripts
