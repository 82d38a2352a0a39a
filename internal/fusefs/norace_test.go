//go:build !race

package fusefs

// raceBuild is set when the tests run under the race detector.
const raceBuild = false
