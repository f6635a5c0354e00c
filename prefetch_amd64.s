#include "textflag.h"

// func prefetchw3(head *linkField, seq *relUint32, val *unsafe.Pointer)
//
// PREFETCHW is 0F 0D /1; the Go assembler has no mnemonic for it, so it is
// written as bytes, with ModRM 0x08, 0x0B and 0x09 for (AX), (BX), (CX).
TEXT ·prefetchw3(SB), NOSPLIT|NOFRAME, $0-24
	MOVQ head+0(FP), AX
	MOVQ seq+8(FP), BX
	MOVQ val+16(FP), CX
	BYTE $0x0F; BYTE $0x0D; BYTE $0x08 // PREFETCHW (AX)
	BYTE $0x0F; BYTE $0x0D; BYTE $0x0B // PREFETCHW (BX)
	BYTE $0x0F; BYTE $0x0D; BYTE $0x09 // PREFETCHW (CX)
	RET

// func prefetchw(addrs []unsafe.Pointer)
TEXT ·prefetchw(SB), NOSPLIT|NOFRAME, $0-24
	MOVQ addrs_base+0(FP), SI
	MOVQ addrs_len+8(FP), CX
	TESTQ CX, CX
	JZ done
loop:
	MOVQ (SI), AX
	BYTE $0x0F; BYTE $0x0D; BYTE $0x08 // PREFETCHW (AX)
	ADDQ $8, SI
	DECQ CX
	JNZ loop
done:
	RET

// func cpuid(leaf, sub uint32) (eax, ebx, ecx, edx uint32)
TEXT ·cpuid(SB), NOSPLIT|NOFRAME, $0-24
	MOVL leaf+0(FP), AX
	MOVL sub+4(FP), CX
	CPUID
	MOVL AX, eax+8(FP)
	MOVL BX, ebx+12(FP)
	MOVL CX, ecx+16(FP)
	MOVL DX, edx+20(FP)
	RET
