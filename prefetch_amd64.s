#include "textflag.h"

// func prefetchw3(a, b, c unsafe.Pointer)
//
// PREFETCHW is 0F 0D /1; the Go assembler has no mnemonic for it, so it is
// written as bytes, with ModRM 0x08, 0x0B and 0x09 for (AX), (BX), (CX).
TEXT ·prefetchw3(SB), NOSPLIT|NOFRAME, $0-24
	MOVQ a+0(FP), AX
	MOVQ b+8(FP), BX
	MOVQ c+16(FP), CX
	BYTE $0x0F; BYTE $0x0D; BYTE $0x08 // PREFETCHW (AX)
	BYTE $0x0F; BYTE $0x0D; BYTE $0x0B // PREFETCHW (BX)
	BYTE $0x0F; BYTE $0x0D; BYTE $0x09 // PREFETCHW (CX)
	RET
